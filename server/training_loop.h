// Schedules measured where users train: a client reports what
// `mutwo.apply` (eager or under torch.compile) or mutwo::ScheduledStep
// measured in its own loop (ReportTrainingLoop); the report is checked
// against the job it names, judged here (the client's own verdict is not
// taken on trust) and kept with the job's result.
//
// Pure functions over the protos (no store, no clock); JobCore stores the
// job they changed.
#ifndef MUTWO_SERVER_TRAINING_LOOP_H_
#define MUTWO_SERVER_TRAINING_LOOP_H_

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {

// Reports kept per batch size (the newest; older ones are dropped).
inline constexpr int kTrainingLoopReportsKept = 16;

// Judges `report` and adds it to `job`: the job must have a result at its
// batch size with an outcome and a schedule for its budget, and the report
// must be of that schedule (graph fingerprint and budget bytes). Sets the
// verdict (`holds`, `problem`: peak within the budget, the same step as the
// unmodified one, every decision applied) and the outcome's training-loop
// fields; returns the outcome. InvalidArgument naming the field for a
// malformed report, FailedPrecondition for one that does not match the
// job's schedule; `job` is unchanged then.
absl::StatusOr<v1::BudgetOutcome> AddTrainingLoopReport(
    v1::Job& job, v1::TrainingLoopValidation& report,
    v1::Schedule* ran = nullptr);

// The correction to plan the budget again with after `report` (judged by
// AddTrainingLoopReport) of schedule `ran`: when its only problem is the
// peak over the budget, what the loop measured over the prediction plus
// `margin_fraction` of the budget, and at least the schedule's own
// correction plus that margin (the closed loop's CorrectionAfter); 0 when
// re-planning cannot help (it holds, it ran out of memory, the step
// differs, or decisions were not applied).
int64_t TrainingLoopCorrection(const v1::Schedule& ran,
                               const v1::TrainingLoopValidation& report,
                               double margin_fraction);

}  // namespace mutwo

#endif  // MUTWO_SERVER_TRAINING_LOOP_H_
