// `mutwo-worker execute MODEL.pt --schedule SCHEDULE.json --input ...
// --batch N [...]`: runs baseline and scheduled training steps and prints
// the v1::Validation as JSON (proto field names) or text on stdout.
// Bad arguments, a bad model or schedule, or a schedule of another graph:
// exit 2 and one line on stderr. An out-of-memory is a result (oom: true),
// exit 0.
#ifndef MUTWO_WORKER_EXECUTE_COMMAND_H_
#define MUTWO_WORKER_EXECUTE_COMMAND_H_

#include <string>

#include "common/args.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::worker {

extern const char kExecuteUsage[];

int RunExecuteCommand(const ParsedArgs& args);

// A few lines for people: peaks, budget, time, the correctness checks.
std::string FormatValidationText(const v1::Validation& validation);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_EXECUTE_COMMAND_H_
