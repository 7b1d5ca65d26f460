// `mutwo-worker execute MODEL.pt --schedule SCHEDULE.json --input ...
// --batch N [...]`: runs baseline and scheduled training steps and prints
// the v1::Validation as text (default) or JSON (--output json, proto field
// names) on stdout.
// Bad arguments, a bad model or schedule, or a schedule of another graph:
// exit 2 and one line on stderr. A schedule the planner marked infeasible is
// refused with exit 3 (naming the budget and the floor) unless --force.
// After the result is printed, exit 1 and one line on stderr when it does
// not prove the schedule (common/validation_check.h): the measured peak
// exceeds the budget, the step ran out of memory (oom: true), or gradients,
// loss or batch-norm statistics differ from the unmodified step (not
// compared with --baseline=false).
#ifndef MUTWO_WORKER_EXECUTE_COMMAND_H_
#define MUTWO_WORKER_EXECUTE_COMMAND_H_

#include <string>

#include "common/args.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::worker {

int RunExecuteCommand(const ParsedArgs& args);

// A few lines for people: peaks, budget, time, the correctness checks.
// The predicted time and overhead are set against the baseline step the
// schedule was planned against (`predicted_baseline`, the profile's; absent
// in results from before it), not against this run's baseline, which timing
// noise or a busy host moves.
std::string FormatValidationText(const v1::Validation& validation);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_EXECUTE_COMMAND_H_
