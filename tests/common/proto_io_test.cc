#include "common/proto_io.h"

#include <cstdio>
#include <string>

#include "common/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

TEST(ProtoIo, ScheduleJsonRoundTripKeepsFieldNamesAndEnums) {
  v1::Schedule schedule;
  schedule.set_policy(v1::MUTWO);
  schedule.set_budget_bytes(int64_t{3} << 30);
  schedule.set_feasible(true);
  schedule.set_graph_fingerprint("abc123");
  auto* d = schedule.add_decisions();
  d->set_value_id(7);
  d->set_action(v1::Decision::RECOMPUTE);
  d->add_recompute_nodes(3);
  const std::string json = ProtoToJson(schedule);
  EXPECT_THAT(json, HasSubstr("\"budget_bytes\": \"3221225472\""));
  EXPECT_THAT(json, HasSubstr("\"action\": \"RECOMPUTE\""));
  EXPECT_THAT(json, HasSubstr("\"predicted_peak_bytes\""));  // defaults printed
  v1::Schedule back;
  ASSERT_TRUE(ProtoFromJson(json, "test", &back).ok());
  EXPECT_EQ(back.SerializeAsString(), schedule.SerializeAsString());
}

TEST(ProtoIo, ProfileBinaryRoundTrip) {
  v1::Profile profile;
  profile.set_batch_size(8);
  *profile.add_inputs() = *ParseTensorSpec("x:float32[B,3,32,32]");
  auto* a = profile.add_activations();
  a->set_value_id(1);
  a->set_size_bytes(4096);
  a->set_last_forward_use(3);
  a->set_first_backward_use(10);
  v1::Profile back;
  ASSERT_TRUE(back.ParseFromString(profile.SerializeAsString()));
  EXPECT_EQ(back.activations(0).first_backward_use(), 10);
  EXPECT_EQ(back.inputs(0).dims(0), kBatchDim);
}

TEST(ProtoIo, BadJsonNamesTheSource) {
  v1::Profile profile;
  auto status =
      ProtoFromJson("{\"batch_size\": \"eight\"}", "file \"p.json\"", &profile);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("file \"p.json\": not a valid Profile JSON"));
  EXPECT_FALSE(ProtoFromJson("{\"no_such_field\": 1}", "x", &profile).ok());
}

TEST(ProtoIo, FilesWriteAtomicallyAndRespectLimits) {
  const std::string path = ::testing::TempDir() + "/proto_io_test.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "hello").ok());
  EXPECT_EQ(*ReadFile(path), "hello");
  EXPECT_EQ(ReadFile(path, 3).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReadFile(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace mutwo

namespace mutwo {
namespace {

TEST(ProtoIo, JsonQuoteEscapes) {
  EXPECT_EQ(JsonQuote("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
  EXPECT_EQ(JsonQuote(std::string("\x01", 1)), "\"\\u0001\"");
}

}  // namespace
}  // namespace mutwo
