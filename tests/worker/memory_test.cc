#include "worker/memory.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "worker/interpreter.h"

namespace mutwo::worker {
namespace {

std::unique_ptr<DeviceBackend> Cpu() {
  auto backend = CreateDeviceBackend("cpu", 0);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return *std::move(backend);
}

TEST(CountingCpuAllocatorTest, CountsAllocatedAndPeakBytes) {
  auto backend = Cpu();
  EXPECT_TRUE(CountingCpuAllocatorInstalled());
  const int64_t before = backend->AllocatedBytes();
  backend->ResetPeak();
  {
    torch::Tensor a = torch::empty({1 << 20}, torch::kUInt8);
    EXPECT_EQ(backend->AllocatedBytes(), before + (1 << 20));
    {
      torch::Tensor b = torch::empty({256, 1024}, torch::kFloat32);  // 1 MiB
      EXPECT_EQ(backend->AllocatedBytes(), before + (2 << 20));
    }
    EXPECT_EQ(backend->AllocatedBytes(), before + (1 << 20));
    EXPECT_EQ(backend->PeakBytes(), before + (2 << 20));
    backend->ResetPeak();
    EXPECT_EQ(backend->PeakBytes(), before + (1 << 20));
  }
  EXPECT_EQ(backend->AllocatedBytes(), before);
}

TEST(CountingCpuAllocatorTest, TagsLiveBlocksAndLogsFrees) {
  auto backend = Cpu();
  backend->SetTag(42);
  torch::Tensor a = torch::ones({1000}, torch::kFloat32);
  backend->SetTag(kIdleTag);
  const auto address = reinterpret_cast<uintptr_t>(a.storage().data());
  bool found = false;
  for (const LiveBlock& block : backend->LiveBlocks()) {
    if (block.address == address) {
      found = true;
      EXPECT_EQ(block.tag, 42);
      EXPECT_EQ(block.size_bytes, 4000);
    }
  }
  EXPECT_TRUE(found);
  backend->StartFreeLog();
  backend->SetTag(7);
  a = torch::Tensor();
  backend->SetTag(kIdleTag);
  const std::vector<FreeEvent> frees = backend->StopFreeLog();
  ASSERT_EQ(frees.size(), 1u);
  EXPECT_EQ(frees[0].address, address);
  EXPECT_EQ(frees[0].tag, 7);
}

TEST(CountingCpuAllocatorTest, LimitMakesAllocationsFailAsOutOfMemory) {
  auto backend = CreateDeviceBackend("cpu", 0);
  ASSERT_TRUE(backend.ok());
  const int64_t now = (*backend)->AllocatedBytes();
  InstallCountingCpuAllocator(now + (1 << 20));
  EXPECT_NO_THROW(torch::empty({1 << 19}, torch::kUInt8));
  bool threw = false;
  try {
    torch::empty({2 << 20}, torch::kUInt8);
  } catch (const std::exception& e) {
    threw = true;
    EXPECT_TRUE(IsOutOfMemory(e)) << e.what();
  }
  EXPECT_TRUE(threw);
  InstallCountingCpuAllocator(0);
  EXPECT_NO_THROW(torch::empty({2 << 20}, torch::kUInt8));
}

TEST(DeviceBackendTest, RefusesUnknownDevicesAndDescribesTheCpu) {
  EXPECT_EQ(CreateDeviceBackend("tpu", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateDeviceBackend("cuda:x", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateDeviceBackend("cpu", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto backend = Cpu();
  const v1::DeviceInfo info = backend->Describe();
  EXPECT_EQ(info.kind(), "cpu");
  EXPECT_GT(info.total_bytes(), 0);
  EXPECT_FALSE(info.libtorch_version().empty());
  const int a = backend->Mark();
  const int b = backend->Mark();
  EXPECT_GE(backend->ElapsedMs(a, b), 0.0);
}

}  // namespace
}  // namespace mutwo::worker
