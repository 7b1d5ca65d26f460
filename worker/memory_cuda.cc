// CUDA implementation of DeviceBackend (compiled only with MUTWO_WITH_CUDA):
// memory from the caching allocator's device statistics, allocation tracking
// from its trace tracker, time from CUDA events.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/memory.h"

namespace mutwo::worker {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

// Index of the aggregate pool in the allocator's per-pool statistics.
constexpr size_t kAggregatePool = 0;

// Receives the caching allocator's trace (attached once per process; the
// allocator offers no detach) and keeps the live blocks of one device.
class TraceTable {
 public:
  static TraceTable* Get() {
    static TraceTable* const table = new TraceTable();
    return table;
  }

  void Attach(int device) {
    device_.store(device);
    if (attached_.exchange(true)) return;
    cca::attachAllocatorTraceTracker(
        [](const cca::TraceEntry& entry) { Get()->OnTrace(entry); });
  }

  void set_tag(int64_t tag) { tag_.store(tag); }

  std::vector<LiveBlock> Live() {
    absl::MutexLock lock(&mu_);
    std::vector<LiveBlock> out;
    out.reserve(blocks_.size());
    for (const auto& [addr, block] : blocks_) {
      out.push_back({addr, block.bytes, block.tag});
    }
    return out;
  }
  void StartFreeLog() {
    absl::MutexLock lock(&mu_);
    free_log_.clear();
    logging_frees_ = true;
  }
  std::vector<FreeEvent> StopFreeLog() {
    absl::MutexLock lock(&mu_);
    logging_frees_ = false;
    return std::move(free_log_);
  }

 private:
  struct Block {
    int64_t bytes;
    int64_t tag;
  };

  // The trace carries the requested size; the allocator's statistics (and
  // the device) count blocks rounded up to 512 bytes.
  static int64_t RoundedSize(int64_t bytes) {
    constexpr int64_t kMinBlockBytes = 512;
    if (bytes < kMinBlockBytes) return kMinBlockBytes;
    return (bytes + kMinBlockBytes - 1) / kMinBlockBytes * kMinBlockBytes;
  }

  // Runs under the caching allocator's lock: no CUDA allocations here.
  void OnTrace(const cca::TraceEntry& entry) {
    if (static_cast<int>(entry.device_) != device_.load()) return;
    const uintptr_t addr = static_cast<uintptr_t>(entry.addr_);
    if (entry.action_ == cca::TraceEntry::ALLOC) {
      absl::MutexLock lock(&mu_);
      blocks_[addr] =
          Block{RoundedSize(static_cast<int64_t>(entry.size_)), tag_.load()};
    } else if (entry.action_ == cca::TraceEntry::FREE_REQUESTED) {
      absl::MutexLock lock(&mu_);
      if (blocks_.erase(addr) > 0 && logging_frees_) {
        free_log_.push_back({addr, tag_.load()});
      }
    }
  }

  std::atomic<bool> attached_{false};
  std::atomic<int> device_{0};
  std::atomic<int64_t> tag_{kIdleTag};
  absl::Mutex mu_;
  absl::flat_hash_map<uintptr_t, Block> blocks_ ABSL_GUARDED_BY(mu_);
  bool logging_frees_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<FreeEvent> free_log_ ABSL_GUARDED_BY(mu_);
};

class CudaBackend final : public DeviceBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {}

  std::string kind() const override { return "cuda"; }
  int64_t AllocatedBytes() override {
    return cca::getDeviceStats(device_).allocated_bytes[kAggregatePool].current;
  }
  int64_t PeakBytes() override {
    return cca::getDeviceStats(device_).allocated_bytes[kAggregatePool].peak;
  }
  void ResetPeak() override { cca::resetPeakStats(device_); }
  void Synchronize() override { c10::cuda::device_synchronize(); }
  bool SupportsTracking() const override { return true; }
  void SetTag(int64_t tag) override { TraceTable::Get()->set_tag(tag); }
  std::vector<LiveBlock> LiveBlocks() override {
    return TraceTable::Get()->Live();
  }
  void StartFreeLog() override { TraceTable::Get()->StartFreeLog(); }
  std::vector<FreeEvent> StopFreeLog() override {
    return TraceTable::Get()->StopFreeLog();
  }
  int Mark() override {
    if (used_ == events_.size()) {
      events_.push_back(
          std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    }
    events_[used_]->record();
    return static_cast<int>(used_++);
  }
  double ElapsedMs(int from, int to) override {
    return events_[from]->elapsed_time(*events_[to]);
  }
  void ClearMarks() override { used_ = 0; }

  v1::DeviceInfo Describe() override {
    v1::DeviceInfo info;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) {
      info.set_name(prop.name);
      info.set_total_bytes(static_cast<int64_t>(prop.totalGlobalMem));
      info.set_cuda_capability(absl::StrCat(prop.major, ".", prop.minor));
    }
    info.set_kind("cuda");
    info.set_index(device_);
    info.set_libtorch_version(TORCH_VERSION);
    // Pinned copies of 64 MiB, best of 3, each way.
    constexpr int64_t kBytes = 64 << 20;
    auto host = torch::empty(
        {kBytes},
        torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
    auto dev = torch::empty({kBytes},
                            torch::TensorOptions()
                                .dtype(torch::kUInt8)
                                .device(torch::Device(torch::kCUDA, device_)));
    auto best_ms = [&](bool to_device) {
      double best = 0;
      for (int i = 0; i < 4; ++i) {
        at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
        start.record();
        if (to_device) {
          dev.copy_(host, /*non_blocking=*/true);
        } else {
          host.copy_(dev, /*non_blocking=*/true);
        }
        end.record();
        end.synchronize();
        const double ms = start.elapsed_time(end);
        if (i > 0 && (best == 0 || ms < best)) best = ms;  // first: warm-up
      }
      return best;
    };
    const double h2d_ms = best_ms(true);
    const double d2h_ms = best_ms(false);
    if (h2d_ms > 0) {
      info.set_host_to_device_bytes_per_second(kBytes / (h2d_ms / 1000.0));
    }
    if (d2h_ms > 0) {
      info.set_device_to_host_bytes_per_second(kBytes / (d2h_ms / 1000.0));
    }
    return info;
  }

 private:
  int device_;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events_;
  size_t used_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCudaDeviceBackend(
    int device_index, int64_t memory_limit_bytes) {
  if (!torch::cuda::is_available()) {
    return absl::InvalidArgumentError("device cuda: no CUDA device is visible");
  }
  if (device_index >= static_cast<int>(torch::cuda::device_count())) {
    return absl::InvalidArgumentError(
        absl::StrCat("device cuda:", device_index, ": only ",
                     torch::cuda::device_count(), " CUDA devices"));
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  // Statistics throw before CUDA is initialised on the device.
  torch::empty({1}, torch::TensorOptions().device(
                        torch::Device(torch::kCUDA, device_index)));
  TraceTable::Get()->Attach(device_index);
  if (memory_limit_bytes > 0) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device_index) == cudaSuccess) {
      const double fraction =
          std::min(1.0, static_cast<double>(memory_limit_bytes) /
                            static_cast<double>(prop.totalGlobalMem));
      cca::setMemoryFraction(fraction, device_index);
    }
  }
  return std::unique_ptr<DeviceBackend>(new CudaBackend(device_index));
}

}  // namespace mutwo::worker
