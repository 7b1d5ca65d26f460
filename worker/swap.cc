#include "worker/swap.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <mutex>

namespace mutwo::worker {
namespace {

class CpuHostStash final : public HostStash {
 public:
  explicit CpuHostStash(const c10::Storage& storage)
      : storage_(storage.getWeakStorageImpl()),
        impl_(storage.unsafeGetStorageImpl()),
        nbytes_(static_cast<int64_t>(storage.nbytes())) {}

  void Offload() override {
    if (offloaded_) return;
    c10::intrusive_ptr<c10::StorageImpl> impl = storage_.lock();
    if (!impl || impl->data() == nullptr) return;
    host_.reset(new char[nbytes_]);
    std::memcpy(host_.get(), impl->data(), nbytes_);
    impl->set_data_ptr(c10::DataPtr(nullptr, impl->device()));
    offloaded_ = true;
  }
  void Prefetch() override { Restore(); }
  void Restore() override {
    if (!offloaded_) return;
    offloaded_ = false;
    c10::intrusive_ptr<c10::StorageImpl> impl = storage_.lock();
    if (impl) {
      c10::DataPtr data = impl->allocator()->allocate(nbytes_);
      std::memcpy(data.get(), host_.get(), nbytes_);
      impl->set_data_ptr(std::move(data));
    }
    host_.reset();
  }
  bool offloaded() const override { return offloaded_; }
  int64_t nbytes() const override { return nbytes_; }
  const c10::StorageImpl* storage() const override { return impl_; }

 private:
  c10::weak_intrusive_ptr<c10::StorageImpl> storage_;
  const c10::StorageImpl* impl_;
  int64_t nbytes_;
  std::unique_ptr<char[]> host_;
  bool offloaded_ = false;
};

}  // namespace

std::unique_ptr<HostStash> MakeHostStash(const c10::Storage& storage,
                                         const torch::Device& device) {
#ifdef MUTWO_WITH_CUDA
  if (device.is_cuda()) return MakeCudaHostStash(storage, device);
#endif
  return std::make_unique<CpuHostStash>(storage);
}

std::string SaveCpuRng() {
  auto gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  return std::string(static_cast<const char*>(state.data_ptr()),
                     static_cast<size_t>(state.nbytes()));
}

void RestoreCpuRng(const std::string& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  // from_blob: no allocation; set_state copies the bytes.
  torch::Tensor bytes =
      torch::from_blob(const_cast<char*>(state.data()),
                       {static_cast<int64_t>(state.size())}, torch::kUInt8);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(bytes);
}

torch::Tensor SaveDeviceRng(const torch::Device& device) {
#ifdef MUTWO_WITH_CUDA
  if (device.is_cuda())
    return SaveCudaRng(device.has_index() ? device.index() : 0);
#endif
  (void)device;
  return torch::Tensor();
}

void RestoreDeviceRng(const torch::Device& device, const torch::Tensor& state) {
#ifdef MUTWO_WITH_CUDA
  if (device.is_cuda() && state.defined()) {
    RestoreCudaRng(device.has_index() ? device.index() : 0, state);
  }
#endif
  (void)device;
  (void)state;
}

}  // namespace mutwo::worker
