#include "common/server_address.h"

#include <cstdlib>

namespace mutwo {

std::string ResolveServerAddress(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("MUTWO_SERVER");
  return env != nullptr && *env != 0 ? env : kDefaultServer;
}

}  // namespace mutwo
