// Which mutwo-server a process talks to: the CLI (`mutwo`), the Python
// client's equivalent and the worker (`mutwo-worker serve`) resolve it the
// same way, so one MUTWO_SERVER in the environment points all of them at
// one server.
#ifndef MUTWO_COMMON_SERVER_ADDRESS_H_
#define MUTWO_COMMON_SERVER_ADDRESS_H_

#include <string>

namespace mutwo {

inline constexpr char kDefaultServer[] = "127.0.0.1:50051";

// `flag` (a --server value) when not empty, else the environment variable
// MUTWO_SERVER when set and not empty, else kDefaultServer.
std::string ResolveServerAddress(const std::string& flag);

}  // namespace mutwo

#endif  // MUTWO_COMMON_SERVER_ADDRESS_H_
