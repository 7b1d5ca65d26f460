#include "common/proto_io.h"

#include <sys/resource.h>

#include <csignal>
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

// Profiles stored by older versions have ProfileNode.occurrences (always 1)
// and Activation.occurrence (always 0), now reserved: they still load, as
// JSON (the form `mutwo plan` reads) and as the binary the store keeps.
TEST(ProtoIo, ProfilesWithRetiredOccurrenceFieldsStillLoad) {
  const std::string old_json = R"({
 "graph_fingerprint": "cf595fe70868d639",
 "batch_size": "16",
 "nodes": [
  {"id": 0, "kind": "aten::conv2d", "scope": "conv1", "forward_ms": 0.5,
   "allocated_bytes_after": "1024", "occurrences": 1, "input_nodes": [],
   "is_op": true, "peak_bytes_during": "2048"},
  {"id": 1, "kind": "aten::relu", "occurrences": 1, "inputNodes": [0],
   "is_op": true}
 ],
 "activations": [
  {"value_id": 0, "producer_node": 0, "occurrence": 0, "size_bytes": "512",
   "storages": 1, "last_forward_use": 1, "first_backward_use": 3,
   "last_backward_use": 3, "recompute_nodes": [0]},
  {"value_id": 1, "producerNode": 1, "occurrence": 0, "sizeBytes": "256"}
 ]
})";
  v1::Profile profile;
  absl::Status status = ProtoFromJson(old_json, "old.json", &profile);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(profile.graph_fingerprint(), "cf595fe70868d639");
  EXPECT_EQ(profile.batch_size(), 16);
  ASSERT_EQ(profile.nodes_size(), 2);
  EXPECT_EQ(profile.nodes(0).scope(), "conv1");
  EXPECT_EQ(profile.nodes(0).forward_ms(), 0.5);
  EXPECT_EQ(profile.nodes(0).peak_bytes_during(), 2048);
  EXPECT_EQ(profile.nodes(1).input_nodes(0), 0);
  ASSERT_EQ(profile.activations_size(), 2);
  EXPECT_EQ(profile.activations(0).size_bytes(), 512);
  EXPECT_EQ(profile.activations(0).first_backward_use(), 3);
  EXPECT_EQ(profile.activations(0).recompute_nodes(0), 0);
  EXPECT_EQ(profile.activations(1).producer_node(), 1);
  EXPECT_EQ(profile.activations(1).size_bytes(), 256);

  // A retired name does not make other unknown members acceptable.
  status = ProtoFromJson(
      R"({"nodes": [{"id": 0, "occurrences": 1, "occurences": 1}]})", "typo",
      &profile);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("occurences"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("typo: not a valid"));
  // Nor a bad value beside it.
  status = ProtoFromJson(
      R"({"batch_size": "eight", "activations": [{"occurrence": 0}]})", "bad",
      &profile);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);

  // Binary: ProfileNode field 7 (occurrences = 1) after id = 4.
  v1::ProfileNode node;
  ASSERT_TRUE(node.ParseFromString(std::string("\x08\x04\x38\x01", 4)));
  EXPECT_EQ(node.id(), 4);
  // Activation field 3 (occurrence = 2) after value_id = 5.
  v1::Activation activation;
  ASSERT_TRUE(activation.ParseFromString(std::string("\x08\x05\x18\x02", 4)));
  EXPECT_EQ(activation.value_id(), 5);
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

// A write the file system refuses (here the file size limit, as a full disk
// would) names the cause, removes its partial .tmp and keeps the file that
// was there.
TEST(ProtoIo, AFailedWriteNamesTheCauseAndKeepsTheOldFile) {
  const std::string path = ::testing::TempDir() + "/proto_io_limit.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "kept").ok());
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status status =
      WriteFileAtomically(path, std::string(1 << 20, 'x'));
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              ::testing::AllOf(::testing::HasSubstr("proto_io_limit.bin.tmp"),
                               ::testing::HasSubstr("1048576 bytes"),
                               ::testing::HasSubstr("File too large")));
  EXPECT_FALSE(ReadFile(path + ".tmp").ok());
  EXPECT_EQ(*ReadFile(path), "kept");
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
