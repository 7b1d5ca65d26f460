// SWAP: moves a storage's bytes to host memory and frees its device memory,
// and brings them back. Also the RNG snapshots the recompute replay needs.
//
// - CPU (what CI tests): a plain host buffer (operator new, outside the
//   counting allocator), memcpy out, the storage's DataPtr replaced by an
//   empty one (the counting allocator sees the free); restoring allocates
//   from the storage's own allocator, copies back and sets the DataPtr.
// - CUDA (MUTWO_WITH_CUDA, swap_cuda.cc): pinned host memory; the offload
//   runs on a side stream after an event on the compute stream, and the
//   device block is released with recordStream so the caching allocator
//   reuses it only after the copy; the prefetch copies back on a second
//   side stream and the compute stream waits on its event.
//
// The storage object itself stays (autograd's saved variables point to it);
// only its memory goes and comes back, so versions and views are unchanged.
// Not thread-safe.
#ifndef MUTWO_WORKER_SWAP_H_
#define MUTWO_WORKER_SWAP_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

namespace mutwo::worker {

class HostStash {
 public:
  virtual ~HostStash() = default;
  // Starts (CPU: does) the copy to host and frees the device memory. The
  // storage must not be read until Restore().
  virtual void Offload() = 0;
  // Starts the copy back (idempotent; a no-op unless offloaded).
  virtual void Prefetch() = 0;
  // Makes the bytes usable on the compute stream (Prefetch if needed, then
  // an event wait on CUDA).
  virtual void Restore() = 0;
  virtual bool offloaded() const = 0;
  virtual int64_t nbytes() const = 0;
  // The storage it moves (for identity only; never dereferenced).
  virtual const c10::StorageImpl* storage() const = 0;
};

// For a storage on `device` (cpu or cuda). Holds the storage weakly: if
// autograd drops it, Offload/Restore do nothing.
std::unique_ptr<HostStash> MakeHostStash(const c10::Storage& storage,
                                         const torch::Device& device);

// RNG snapshots: the CPU generator's state (kept as plain bytes, outside
// the counting allocator, so that it does not count as device memory), and
// the device generator's on CUDA (an undefined tensor on CPU).
std::string SaveCpuRng();
void RestoreCpuRng(const std::string& state);
torch::Tensor SaveDeviceRng(const torch::Device& device);
void RestoreDeviceRng(const torch::Device& device, const torch::Tensor& state);

#ifdef MUTWO_WITH_CUDA
// swap_cuda.cc
std::unique_ptr<HostStash> MakeCudaHostStash(const c10::Storage& storage,
                                             const torch::Device& device);
torch::Tensor SaveCudaRng(int device_index);
void RestoreCudaRng(int device_index, const torch::Tensor& state);
#endif

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_SWAP_H_
