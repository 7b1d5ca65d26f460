// `mutwo-worker profile MODEL.pt --input ... --batch N [...]`: profiles one
// training step and prints the Profile as JSON, CSV or text on stdout.
// Bad arguments or a bad model: exit 2 and one line on stderr naming the
// problem. An out-of-memory is a result (oom: true), exit 0.
#ifndef MUTWO_WORKER_PROFILE_COMMAND_H_
#define MUTWO_WORKER_PROFILE_COMMAND_H_

#include "common/args.h"

namespace mutwo::worker {

extern const char kProfileUsage[];

int RunProfileCommand(const ParsedArgs& args);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_PROFILE_COMMAND_H_
