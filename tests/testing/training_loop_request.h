// A ReportTrainingLoop request as `python3 -m mutwo verify --report` sends
// it: job `job_id`'s `schedule` measured in a training loop at `peak_bytes`
// and 10 ms a step, every decision applied, the step the same as the
// unmodified one. Tests change what they test from there.
#ifndef MUTWO_TESTS_TESTING_TRAINING_LOOP_REQUEST_H_
#define MUTWO_TESTS_TESTING_TRAINING_LOOP_REQUEST_H_

#include <cstdint>
#include <string>

#include "mutwo/v1/planner.pb.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::testing {

inline v1::ReportTrainingLoopRequest TrainingLoopRequest(
    const std::string& job_id, const v1::Schedule& schedule, int64_t peak_bytes,
    v1::TrainingLoopValidation::Path path = v1::TrainingLoopValidation::EAGER) {
  v1::ReportTrainingLoopRequest request;
  request.set_job_id(job_id);
  v1::TrainingLoopValidation& t = *request.mutable_report();
  t.set_path(path);
  *t.mutable_budget() = schedule.budget();
  t.set_decisions_planned(schedule.recomputed() + schedule.swapped());
  t.set_decisions_applied(schedule.recomputed() + schedule.swapped());
  v1::Validation& v = *t.mutable_validation();
  v.set_batch_size(schedule.batch_size());
  v.set_budget_bytes(schedule.budget_bytes());
  v.set_graph_fingerprint(schedule.graph_fingerprint());
  v.mutable_scheduled()->set_peak_bytes(peak_bytes);
  v.mutable_scheduled()->set_iteration_ms(10);
  v.set_gradients_match(true);
  v.set_batchnorm_stats_match(true);
  return request;
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_TRAINING_LOOP_REQUEST_H_
