#include "common/flag_values.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

TEST(ParseChoice, AnyCaseGivesTheCanonicalSpelling) {
  EXPECT_EQ(*ParseChoice("--output", "JSON", {"text", "json"}), "json");
  EXPECT_EQ(*ParseChoice("--state", "succeeded", {"SUCCEEDED", "FAILED"}),
            "SUCCEEDED");
  EXPECT_EQ(*ParseChoice("--policy", " Sqrt_N ", {"mutwo", "sqrt_n"}),
            "sqrt_n");
}

TEST(ParseChoice, ErrorNamesTheFlagAndTheChoices) {
  EXPECT_EQ(ParseChoice("--output", "xml", {"text", "json"}).status().message(),
            "--output \"xml\": use text or json");
  EXPECT_EQ(ParseChoice("--kind", "x", {"a", "b", "c"}).status().message(),
            "--kind \"x\": use a, b or c");
}

TEST(ParseDeviceKind, CpuCudaOrAny) {
  EXPECT_EQ(*ParseDeviceKind("--device_kind", "CUDA"), "cuda");
  EXPECT_EQ(*ParseDeviceKind("--device_kind", ""), "");
  EXPECT_THAT(
      std::string(ParseDeviceKind("--device_kind", "tpu").status().message()),
      ::testing::HasSubstr("--device_kind \"tpu\": use cpu or cuda"));
}

TEST(ParseMemorySize, NeedsAUnit) {
  EXPECT_EQ(*ParseMemorySize("--capacity", "80GiB"), int64_t{80} << 30);
  EXPECT_EQ(*ParseMemorySize("--memory_limit", " 512B "), 512);
  EXPECT_EQ(*ParseMemorySize("--capacity", "1.5GB"), 1500000000);
  EXPECT_EQ(ParseMemorySize("--capacity", "80").status().message(),
            "--capacity \"80\": a bare number is ambiguous; say 80GiB, 80GB "
            "or 80B");
  EXPECT_THAT(
      std::string(
          ParseMemorySize("--memory_limit", "2 lots").status().message()),
      ::testing::HasSubstr("--memory_limit: size \"2 lots\": unknown unit"));
}

}  // namespace
}  // namespace mutwo
