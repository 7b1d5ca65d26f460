// CUDA side of swap.h: pinned host buffers, side-stream copies with events,
// device blocks released with recordStream; the CUDA RNG snapshots.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <mutex>

#include "worker/swap.h"

namespace mutwo::worker {
namespace {

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " +
                             cudaGetErrorString(error));
  }
}

class CudaHostStash final : public HostStash {
 public:
  CudaHostStash(const c10::Storage& storage, const torch::Device& device)
      : storage_(storage.getWeakStorageImpl()),
        impl_(storage.unsafeGetStorageImpl()),
        nbytes_(static_cast<int64_t>(storage.nbytes())),
        device_index_(device.has_index() ? device.index() : 0) {}

  ~CudaHostStash() override {
    // The pinned buffer goes back to its cache only once no copy reads it.
    if (offload_started_) offload_done_.synchronize();
    if (prefetch_started_) prefetch_done_.synchronize();
  }

  void Offload() override {
    if (offloaded_) return;
    c10::intrusive_ptr<c10::StorageImpl> impl = storage_.lock();
    if (!impl || impl->data() == nullptr) return;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    host_ = at::empty({nbytes_},
                      at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(side);
    Check(cudaMemcpyAsync(host_.data_ptr(), impl->data(), nbytes_,
                          cudaMemcpyDeviceToHost, side.stream()),
          "offload copy");
    offload_done_.record(side);
    offload_started_ = true;
    c10::cuda::CUDACachingAllocator::recordStream(impl->data_ptr(), side);
    impl->set_data_ptr(c10::DataPtr(nullptr, impl->device()));
    offloaded_ = true;
    prefetched_ = false;
  }

  void Prefetch() override {
    if (!offloaded_ || prefetched_) return;
    prefetched_ = true;
    c10::intrusive_ptr<c10::StorageImpl> impl = storage_.lock();
    if (!impl) return;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    // The caching allocator hands out a block freed on the compute stream:
    // kernels queued there may still use it, so the copy waits for them.
    c10::DataPtr data = impl->allocator()->allocate(nbytes_);
    at::cuda::CUDAEvent allocated;
    allocated.record(compute);
    allocated.block(side);
    offload_done_.block(side);
    Check(cudaMemcpyAsync(data.get(), host_.data_ptr(), nbytes_,
                          cudaMemcpyHostToDevice, side.stream()),
          "prefetch copy");
    prefetch_done_.record(side);
    prefetch_started_ = true;
    c10::cuda::CUDACachingAllocator::recordStream(data, side);
    impl->set_data_ptr(std::move(data));
  }

  void Restore() override {
    if (!offloaded_) return;
    Prefetch();
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    if (prefetch_started_) {
      prefetch_done_.block(c10::cuda::getCurrentCUDAStream());
    }
    offloaded_ = false;
  }

  bool offloaded() const override { return offloaded_; }
  int64_t nbytes() const override { return nbytes_; }
  const c10::StorageImpl* storage() const override { return impl_; }

 private:
  c10::weak_intrusive_ptr<c10::StorageImpl> storage_;
  const c10::StorageImpl* impl_;
  int64_t nbytes_;
  int device_index_;
  at::Tensor host_;
  at::cuda::CUDAEvent offload_done_, prefetch_done_;
  bool offload_started_ = false, prefetch_started_ = false;
  bool offloaded_ = false, prefetched_ = false;
};

}  // namespace

std::unique_ptr<HostStash> MakeCudaHostStash(const c10::Storage& storage,
                                             const torch::Device& device) {
  return std::make_unique<CudaHostStash>(storage, device);
}

torch::Tensor SaveCudaRng(int device_index) {
  auto gen = at::cuda::detail::getDefaultCUDAGenerator(
      static_cast<c10::DeviceIndex>(device_index));
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void RestoreCudaRng(int device_index, const torch::Tensor& state) {
  auto gen = at::cuda::detail::getDefaultCUDAGenerator(
      static_cast<c10::DeviceIndex>(device_index));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace mutwo::worker
