#include "server/device_wait.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

v1::WorkerInfo Worker(const std::string& kind, v1::WorkerInfo::State state) {
  v1::WorkerInfo w;
  w.mutable_device()->set_kind(kind);
  w.set_state(state);
  return w;
}

TEST(DeviceWaitTest, ReasonNamesTheMissingKind) {
  EXPECT_EQ(DeviceWaitReason("cuda", {}), "no cuda worker registered");
  EXPECT_EQ(DeviceWaitReason("", {}), "no worker registered");
  const std::vector<v1::WorkerInfo> cpu = {Worker("cpu", v1::WorkerInfo::IDLE)};
  EXPECT_EQ(DeviceWaitReason("cuda", cpu), "no cuda worker registered");
  EXPECT_EQ(DeviceWaitReason("cpu", cpu), "");
  EXPECT_EQ(DeviceWaitReason("", cpu), "");
  EXPECT_EQ(DeviceWaitReason("CUDA", {Worker("cuda", v1::WorkerInfo::BUSY)}),
            "");
  EXPECT_EQ(DeviceWaitReason("cuda", {Worker("cuda", v1::WorkerInfo::LOST),
                                      Worker("cuda", v1::WorkerInfo::LOST),
                                      Worker("cpu", v1::WorkerInfo::IDLE)}),
            "no live cuda worker (2 registered, all lost: missed heartbeats)");
}

TEST(DeviceWaitTest, CountsOnlyJobsNoLiveWorkerCanRun) {
  const std::map<std::string, int64_t> queued = {
      {"cuda", 3}, {"cpu", 2}, {"", 1}};
  EXPECT_EQ(
      JobsWaitingForDevice({}, {}),
      (std::map<std::string, int64_t>{{"any", 0}, {"cpu", 0}, {"cuda", 0}}));
  EXPECT_EQ(
      JobsWaitingForDevice(queued, {}),
      (std::map<std::string, int64_t>{{"any", 1}, {"cpu", 2}, {"cuda", 3}}));
  EXPECT_EQ(
      JobsWaitingForDevice(queued, {Worker("cpu", v1::WorkerInfo::IDLE)}),
      (std::map<std::string, int64_t>{{"any", 0}, {"cpu", 0}, {"cuda", 3}}));
  EXPECT_EQ(
      JobsWaitingForDevice(queued, {Worker("cuda", v1::WorkerInfo::LOST)}),
      (std::map<std::string, int64_t>{{"any", 1}, {"cpu", 2}, {"cuda", 3}}));
}

}  // namespace
}  // namespace mutwo
