// Client credentials: which addresses are loopback, and that a token never
// goes to a network address without TLS.
#include "common/credentials.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(CredentialsTest, LoopbackAddresses) {
  for (const char* yes :
       {"127.0.0.1:50051", "localhost:1", "[::1]:5", "127.1.2.3:9",
        "ipv4:127.0.0.1:80", "dns:///localhost:50051"}) {
    EXPECT_TRUE(IsLoopbackAddress(yes)) << yes;
  }
  for (const char* no :
       {"0.0.0.0:50051", "[::]:50051", "10.0.0.1:1", "mutwo-server:50051",
        "128.0.0.1:1", "127.0.0.1.evil.com:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(no)) << no;
  }
}

TEST(CredentialsTest, ATokenNeverTravelsToANetworkServerWithoutTls) {
  const fs::path file =
      fs::path(::testing::TempDir()) / absl::StrCat("mutwo_token_", getpid());
  WriteFile(file, "my-token-value\n");
  ClientCredentialsOptions options;
  options.target = "mutwo.example.com:50051";
  options.token_file = file.string();
  options.use_environment = false;
  auto refused = MakeChannelCredentials(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("--tls_ca"));
  EXPECT_THAT(refused.status().message(), Not(HasSubstr("my-token-value")));
  options.target = "127.0.0.1:50051";
  EXPECT_TRUE(MakeChannelCredentials(options).ok());
  options.token_file = file.string() + ".missing";
  auto missing = MakeChannelCredentials(options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  fs::remove(file);
}

}  // namespace
}  // namespace mutwo
