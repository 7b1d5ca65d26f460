// The `mutwo` commands that talk to mutwo-server: submit, jobs, job,
// watch, schedule, profile, plot, cancel, workers. Each returns an exit
// code.
#ifndef MUTWO_CLIENT_RPC_COMMANDS_H_
#define MUTWO_CLIENT_RPC_COMMANDS_H_

#include "common/args.h"

namespace mutwo {

int SubmitCommand(const ParsedArgs& args);
// Re-attaches to a job: progress lines until it ends, then its results;
// exit codes as `submit --wait`.
int WatchCommand(const ParsedArgs& args);
int JobsCommand(const ParsedArgs& args);
int JobCommand(const ParsedArgs& args);
int ScheduleCommand(const ParsedArgs& args);
int ProfileCommand(const ParsedArgs& args);
int PlotCommand(const ParsedArgs& args);
int CancelCommand(const ParsedArgs& args);
int WorkersCommand(const ParsedArgs& args);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_RPC_COMMANDS_H_
