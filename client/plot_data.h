// Plot data of `mutwo plot`: what the server returned, arranged for the one
// renderer, client/plot/mutwo_plot.py (matplotlib; format "mutwo-plot/1",
// described there). Pure functions of their inputs (no I/O, no Python), so
// tests check the numbers a plot shows without rendering it.
#ifndef MUTWO_CLIENT_PLOT_DATA_H_
#define MUTWO_CLIENT_PLOT_DATA_H_

#include <string>
#include <vector>

#include "google/protobuf/struct.pb.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {

inline constexpr char kPlotDataFormat[] = "mutwo-plot/1";

// One training step over time: the schedule's simulated timeline (baseline
// and planned: the high-water mark during each position, what is held
// after it, when it ends) and the profiler's measured baseline timeline;
// the budget, feasibility and why not, predicted and measured peaks, and
// each activation's live intervals without and with the schedule (for the
// PyTorch memory snapshot export).
google::protobuf::Struct TimelinePlotData(const v1::Schedule& schedule,
                                          const v1::Profile& profile,
                                          const std::string& model_name);

// Peak memory vs batch size: the profiled baseline; per requested budget
// the predicted and measured peaks of its schedules; the infeasible
// (batch, budget) requests; the device capacity and the predicted max
// batch with the baseline's fitted line.
google::protobuf::Struct BatchPlotData(const v1::Job& job);

// Peak vs iteration time at one batch size: mutwo's Pareto curve
// (`mutwo.pareto()`), the fixed policies' schedules (`others`: sqrt_n,
// per_block) as single points, the baseline, mutwo's budget, the floor
// (`floor_bytes`, a budget) and, from the job's result at that batch size
// (may be null), the knee (`knee`: its budget, peak, time and overhead
// against the baseline it was planned against).
google::protobuf::Struct ParetoPlotData(
    const v1::Schedule& mutwo, const std::vector<v1::Schedule>& others,
    const std::string& model_name, const v1::BatchResult* result = nullptr);

// The data as JSON (what mutwo_plot.py reads, and `-o FILE.json` writes).
std::string PlotDataJson(const google::protobuf::Struct& data);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_PLOT_DATA_H_
