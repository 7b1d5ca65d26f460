// The `mutwo` CLI. Each command reads its flags (Abseil flags fed by
// common/args), talks to the server with a deadline on every RPC, writes
// results to stdout (text or --output=json) and logs to stderr, and returns
// an exit code from common/args.h.
#ifndef MUTWO_CLIENT_COMMANDS_H_
#define MUTWO_CLIENT_COMMANDS_H_

namespace mutwo {

// Dispatches argv[1] to a command; prints usage for --help.
int RunCli(int argc, char** argv);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_COMMANDS_H_
