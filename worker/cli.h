// The `mutwo-worker` command line: dispatches argv[1] to a subcommand and
// returns its exit code (common/args.h). Kept free of LibTorch headers.
#ifndef MUTWO_WORKER_CLI_H_
#define MUTWO_WORKER_CLI_H_

namespace mutwo {

int RunWorkerCli(int argc, char** argv);

}  // namespace mutwo

#endif  // MUTWO_WORKER_CLI_H_
