// The server address every mutwo process resolves (common/server_address.h):
// --server, else MUTWO_SERVER, else the default.
#include "common/server_address.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace mutwo {
namespace {

TEST(ServerAddressTest, FlagThenEnvironmentThenDefault) {
  ASSERT_EQ(unsetenv("MUTWO_SERVER"), 0);
  EXPECT_EQ(ResolveServerAddress(""), "127.0.0.1:50051");
  EXPECT_EQ(ResolveServerAddress("h:1"), "h:1");
  ASSERT_EQ(setenv("MUTWO_SERVER", "env-host:7", 1), 0);
  EXPECT_EQ(ResolveServerAddress(""), "env-host:7");
  EXPECT_EQ(ResolveServerAddress("h:1"), "h:1");
  // Set but empty: as if unset.
  ASSERT_EQ(setenv("MUTWO_SERVER", "", 1), 0);
  EXPECT_EQ(ResolveServerAddress(""), "127.0.0.1:50051");
  ASSERT_EQ(unsetenv("MUTWO_SERVER"), 0);
}

}  // namespace
}  // namespace mutwo
