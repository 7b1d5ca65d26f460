// The service side of mutwo-worker:
//   serve        the daemon (worker/daemon): register, lease, run, report
//   run-task     one leased task in a child process: reads the task file the
//                daemon wrote, profiles (PROFILE) or executes the schedule
//                (VALIDATE), writes the binary result proto
//   device-info  the device facts as JSON (the daemon asks a child, so the
//                daemon itself never creates a CUDA context)
// Exit codes as common/args.h; run-task exits 2 when the model or the spec
// is bad (the daemon then fails the task without retrying).
#ifndef MUTWO_WORKER_TASK_COMMANDS_H_
#define MUTWO_WORKER_TASK_COMMANDS_H_

#include "common/args.h"

namespace mutwo::worker {

int RunServeCommand(const ParsedArgs& args, const char* argv0);
int RunTaskCommand(const ParsedArgs& args);
int RunDeviceInfoCommand(const ParsedArgs& args);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_TASK_COMMANDS_H_
