#include "worker/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/version.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

namespace mutwo::worker {
namespace {

// LibTorch 2.3 made Allocator::allocate non-const and added copy_data.
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define MUTWO_ALLOCATOR_V2 1
#endif

// Counts every CPU allocation. The DataPtr's context is the data pointer
// itself (some LibTorch ops assert it), so sizes and tags live in a side
// table keyed by address.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static CountingCpuAllocator* Get() {
    static CountingCpuAllocator* const instance = new CountingCpuAllocator();
    return instance;
  }

#ifdef MUTWO_ALLOCATOR_V2
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src,
                 std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  void set_limit(int64_t limit_bytes) { limit_bytes_.store(limit_bytes); }
  void set_tag(int64_t tag) { tag_.store(tag); }

  int64_t allocated() {
    absl::MutexLock lock(&mu_);
    return allocated_;
  }
  int64_t peak() {
    absl::MutexLock lock(&mu_);
    return peak_;
  }
  void ResetPeak() {
    absl::MutexLock lock(&mu_);
    peak_ = allocated_;
  }
  std::vector<LiveBlock> Live() {
    absl::MutexLock lock(&mu_);
    std::vector<LiveBlock> out;
    out.reserve(blocks_.size());
    for (const auto& [ptr, block] : blocks_) {
      out.push_back({reinterpret_cast<uintptr_t>(ptr), block.bytes, block.tag});
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

  CountingCpuAllocator() = default;

  c10::DataPtr Allocate(size_t n) const {
    auto* self = const_cast<CountingCpuAllocator*>(this);
    const int64_t limit = limit_bytes_.load();
    if (limit > 0) {
      absl::MutexLock lock(&self->mu_);
      if (self->allocated_ + static_cast<int64_t>(n) > limit) {
        TORCH_CHECK_WITH(OutOfMemoryError, false,
                         "CPU out of memory: tried to allocate ", n,
                         " bytes with ", self->allocated_, " of the ", limit,
                         " byte limit in use");
      }
    }
    void* data = c10::alloc_cpu(n);
    if (data != nullptr) {
      absl::MutexLock lock(&self->mu_);
      self->blocks_[data] = Block{static_cast<int64_t>(n), tag_.load()};
      self->allocated_ += static_cast<int64_t>(n);
      if (self->allocated_ > self->peak_) self->peak_ = self->allocated_;
    }
    return {data, data, &Delete, c10::Device(c10::DeviceType::CPU)};
  }

  static void Delete(void* ptr) {
    if (ptr == nullptr) return;
    CountingCpuAllocator* self = Get();
    {
      absl::MutexLock lock(&self->mu_);
      auto it = self->blocks_.find(ptr);
      if (it != self->blocks_.end()) {
        self->allocated_ -= it->second.bytes;
        self->blocks_.erase(it);
        if (self->logging_frees_) {
          self->free_log_.push_back(
              {reinterpret_cast<uintptr_t>(ptr), self->tag_.load()});
        }
      }
    }
    c10::free_cpu(ptr);
  }

  std::atomic<int64_t> limit_bytes_{0};
  std::atomic<int64_t> tag_{kIdleTag};
  absl::Mutex mu_;
  absl::flat_hash_map<void*, Block> blocks_ ABSL_GUARDED_BY(mu_);
  int64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  bool logging_frees_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<FreeEvent> free_log_ ABSL_GUARDED_BY(mu_);
};

std::atomic<bool> g_installed{false};

class CpuBackend final : public DeviceBackend {
 public:
  std::string kind() const override { return "cpu"; }
  int64_t AllocatedBytes() override {
    return CountingCpuAllocator::Get()->allocated();
  }
  int64_t PeakBytes() override { return CountingCpuAllocator::Get()->peak(); }
  void ResetPeak() override { CountingCpuAllocator::Get()->ResetPeak(); }
  void Synchronize() override {}
  bool SupportsTracking() const override { return true; }
  void SetTag(int64_t tag) override {
    CountingCpuAllocator::Get()->set_tag(tag);
  }
  std::vector<LiveBlock> LiveBlocks() override {
    return CountingCpuAllocator::Get()->Live();
  }
  void StartFreeLog() override { CountingCpuAllocator::Get()->StartFreeLog(); }
  std::vector<FreeEvent> StopFreeLog() override {
    return CountingCpuAllocator::Get()->StopFreeLog();
  }
  int Mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(marks_.size()) - 1;
  }
  double ElapsedMs(int from, int to) override {
    return std::chrono::duration<double, std::milli>(marks_[to] - marks_[from])
        .count();
  }
  void ClearMarks() override { marks_.clear(); }

  v1::DeviceInfo Describe() override {
    v1::DeviceInfo info;
    info.set_kind("cpu");
    info.set_name("cpu");
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
      if (absl::StartsWith(line, "model name")) {
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          info.set_name(std::string(absl::StripAsciiWhitespace(
              absl::string_view(line).substr(colon + 1))));
        }
        break;
      }
    }
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page_size > 0) {
      info.set_total_bytes(static_cast<int64_t>(pages) * page_size);
    }
    info.set_libtorch_version(TORCH_VERSION);
    return info;
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

void InstallCountingCpuAllocator(int64_t limit_bytes) {
  CountingCpuAllocator* allocator = CountingCpuAllocator::Get();
  allocator->set_limit(limit_bytes);
  if (!g_installed.exchange(true)) {
    // Highest priority, so that nothing later replaces it.
    c10::SetCPUAllocator(allocator, /*priority=*/UINT8_MAX);
  }
}

bool CountingCpuAllocatorInstalled() { return g_installed.load(); }

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateDeviceBackend(
    const std::string& device, int64_t memory_limit_bytes) {
  if (memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory limit must be >= 0, got ", memory_limit_bytes));
  }
  if (device == "cpu") {
    InstallCountingCpuAllocator(memory_limit_bytes);
    return std::unique_ptr<DeviceBackend>(new CpuBackend());
  }
  absl::string_view rest = device;
  if (absl::ConsumePrefix(&rest, "cuda")) {
    int index = 0;
    if (!rest.empty() && (!absl::ConsumePrefix(&rest, ":") ||
                          !absl::SimpleAtoi(rest, &index) || index < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device \"", device, "\": expected cpu, cuda or cuda:N"));
    }
#ifdef MUTWO_WITH_CUDA
    return CreateCudaDeviceBackend(index, memory_limit_bytes);
#else
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", device,
                     "\": this worker was built without CUDA; use --device "
                     "cpu"));
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", device, "\": expected cpu, cuda or cuda:N"));
}

}  // namespace mutwo::worker
