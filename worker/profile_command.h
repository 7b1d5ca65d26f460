// `mutwo-worker profile MODEL.pt --input ... --batch N [...]`: profiles one
// training step and prints the Profile on stdout: a text summary by
// default, the whole Profile with --output json (what `mutwo plan` reads),
// or CSV.
// Bad arguments or a bad model: exit 2 and one line on stderr naming the
// problem. An out-of-memory is a result (oom: true), exit 0.
#ifndef MUTWO_WORKER_PROFILE_COMMAND_H_
#define MUTWO_WORKER_PROFILE_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/args.h"
#include "mutwo/v1/types.pb.h"
#include "worker/step_options.h"

namespace mutwo::worker {

// The training-step flags `profile` and `execute` share (--input,
// --unbatched, --loss, --optimizer, --batch, --device, --warmup,
// --iterations, --seed, --memory_limit), parsed into `options` (the model
// fields are left as they are). InvalidArgument names the flag; an input
// spec without B (not named by --unbatched) is one; the batch size is
// copied as given (each command checks it).
// Prints `mutwo-worker COMMAND: message` (one line) on stderr and returns
// the exit code: kExitBadInput for InvalidArgument and NotFound (bad flags,
// files, models), kExitFailure otherwise.
int CommandFailure(const std::string& command, const absl::Status& status);

[[nodiscard]] absl::Status ReadStepFlags(const ParsedArgs& args,
                                         TrainingStepOptions* options);

int RunProfileCommand(const ParsedArgs& args);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_PROFILE_COMMAND_H_
