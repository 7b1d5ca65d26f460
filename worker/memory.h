// Memory and time truth of one device for the profiler and the executor.
//
// A DeviceBackend answers: how many bytes the allocator holds now, the
// high-water mark since the last ResetPeak(), and (when SupportsTracking())
// which allocations are alive and which run of which node made them. The
// profiler tags every allocation with the timeline position that is running
// (SetTag) and so attributes memory that is not a graph value (dropout masks,
// max-pool indices, batch-norm statistics) to the node that made it.
//
// - CPU: a counting allocator installed once per process with
//   c10::SetCPUAllocator (InstallCountingCpuAllocator). Every CPU tensor
//   allocated after the install is counted; an optional limit makes
//   allocations beyond it fail like an out-of-memory would.
// - CUDA (MUTWO_WITH_CUDA, memory_cuda.cc): the caching allocator's device
//   statistics and its trace tracker.
//
// Thread safety: the allocator side is thread-safe (intra-op threads
// allocate); the tag and the free log are process-wide, so profile one model
// at a time per process.
#ifndef MUTWO_WORKER_MEMORY_H_
#define MUTWO_WORKER_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo::worker {

// Tags that are not timeline positions.
inline constexpr int64_t kIdleTag = -1;  // parameters, inputs, optimizer
inline constexpr int64_t kLossTag = -2;  // the loss computed from the outputs

// One live allocation.
struct LiveBlock {
  uintptr_t address = 0;
  int64_t size_bytes = 0;
  int64_t tag = kIdleTag;
};

// A block freed while the free log was on, with the tag running at the time.
struct FreeEvent {
  uintptr_t address = 0;
  int64_t tag = kIdleTag;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual std::string kind() const = 0;  // "cpu" or "cuda"
  virtual int64_t AllocatedBytes() = 0;
  virtual int64_t PeakBytes() = 0;
  // Sets the high-water mark to the bytes allocated now.
  virtual void ResetPeak() = 0;
  // Waits for queued device work (no-op on CPU).
  virtual void Synchronize() = 0;

  // Allocation tracking; false means tags, live blocks and frees are empty.
  virtual bool SupportsTracking() const = 0;
  virtual void SetTag(int64_t tag) = 0;
  virtual std::vector<LiveBlock> LiveBlocks() = 0;
  virtual void StartFreeLog() = 0;
  virtual std::vector<FreeEvent> StopFreeLog() = 0;

  // Time marks: Mark() records a point on the device timeline and returns
  // its index; ElapsedMs(a, b) is valid after Synchronize(). ClearMarks()
  // forgets them.
  virtual int Mark() = 0;
  virtual double ElapsedMs(int from, int to) = 0;
  virtual void ClearMarks() = 0;

  // Name, kind, total memory, LibTorch version; on CUDA also the capability
  // and the measured pinned host<->device bandwidths.
  virtual v1::DeviceInfo Describe() = 0;
};

// Installs the counting CPU allocator (once per process; later calls only
// change the limit). `limit_bytes` > 0 makes allocations that would exceed it
// throw c10::Error("... out of memory ..."); 0 removes the limit.
void InstallCountingCpuAllocator(int64_t limit_bytes = 0);
bool CountingCpuAllocatorInstalled();

// "cpu" or "cuda:N". CPU installs the counting allocator if needed.
[[nodiscard]] absl::StatusOr<std::unique_ptr<DeviceBackend>>
CreateDeviceBackend(const std::string& device, int64_t memory_limit_bytes);

#ifdef MUTWO_WITH_CUDA
// memory_cuda.cc
[[nodiscard]] absl::StatusOr<std::unique_ptr<DeviceBackend>>
CreateCudaDeviceBackend(int device_index, int64_t memory_limit_bytes);
#endif

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_MEMORY_H_
