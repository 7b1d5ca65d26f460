// What every `mutwo` command that talks to the server shares: the channel,
// the per-RPC deadline (--timeout_ms), the output mode (--output) and the
// mapping from a failed RPC to an exit code and one line on stderr.
#ifndef MUTWO_CLIENT_RPC_H_
#define MUTWO_CLIENT_RPC_H_

#include <memory>
#include <string>

#include "common/server_address.h"
#include "grpcpp/grpcpp.h"
#include "mutwo/v1/planner.grpc.pb.h"

namespace mutwo {

// The server every command talks to: --server, else the environment
// variable MUTWO_SERVER, else kDefaultServer (common/server_address.h, as
// mutwo-worker serve resolves it).
std::string ServerAddress();
// The connection flags given on the command line (" --server=H:P
// --tls_ca=..."; "" when none), for a command line printed as a hint that
// must reach the same server. An address taken from MUTWO_SERVER is left
// out: the hint runs in the same environment.
std::string ServerFlagsText();

// The channel to ServerAddress(), with the credentials of --token_file /
// --tls_ca (or their environment variables, common/credentials.h). Exits with
// kExitBadInput when they cannot be used (unreadable file, token to a
// non-loopback server without TLS).
std::shared_ptr<grpc::Channel> ServerChannel();
std::unique_ptr<v1::Planner::Stub> PlannerStub();
// Sets the deadline of `context` to now + --timeout_ms (times `factor`).
void SetDeadline(grpc::ClientContext& context, double factor = 1.0);
bool JsonOutput();
// Exit code for a failed RPC (common/args.h codes).
int ExitCodeFor(const grpc::Status& status);
// Prints "mutwo COMMAND: MESSAGE" on stderr and returns ExitCodeFor.
int RpcError(const std::string& command, const grpc::Status& status);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_RPC_H_
