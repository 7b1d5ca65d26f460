#include "worker/gradient_memory.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <utility>

namespace mutwo::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Records, in its backward, how many references the engine holds on its
// incoming gradient, into the int64_t its forward was given.
struct ProbeFunction : public torch::autograd::Function<ProbeFunction> {
  static variable_list forward(AutogradContext* ctx, torch::Tensor x,
                               int64_t* use_count) {
    ctx->saved_data["use_count"] = reinterpret_cast<int64_t>(use_count);
    ctx->set_materialize_grads(false);
    return {x.clone()};
  }
  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    auto* use_count =
        reinterpret_cast<int64_t*>(ctx->saved_data["use_count"].toInt());
    *use_count = static_cast<int64_t>(grad_outputs[0].use_count());
    return {grad_outputs[0], torch::Tensor()};
  }
};

int64_t MeasureExclusiveGradientUseCount() {
  int64_t use_count = -1;
  torch::AutoGradMode grad_mode(true);
  torch::Tensor x = torch::zeros({1}, torch::requires_grad());
  torch::Tensor y = ProbeFunction::apply(x, &use_count)[0];
  // MulBackward hands the function a fresh gradient nobody else holds.
  (y * 2).sum().backward();
  return use_count;
}

}  // namespace

int64_t ExclusiveGradientUseCount() {
  // Measured once (thread-safe static initialisation), then only read.
  static const int64_t use_count = MeasureExclusiveGradientUseCount();
  return use_count;
}

at::Tensor TakeGradient(const at::Tensor& grad) {
  if (!grad.defined() || !grad.has_storage() || grad.is_sparse() ||
      grad.layout() != c10::kStrided || grad.is_quantized() ||
      grad.storage().nbytes() == 0 || grad.storage().data() == nullptr ||
      grad.storage().use_count() != 1 ||
      static_cast<int64_t>(grad.use_count()) > ExclusiveGradientUseCount()) {
    return grad;
  }
  c10::StorageImpl* impl = grad.storage().unsafeGetStorageImpl();
  const size_t nbytes = impl->nbytes();
  c10::DataPtr data = impl->set_data_ptr(c10::DataPtr(nullptr, impl->device()));
  c10::Storage own(c10::Storage::use_byte_size_t(), nbytes, std::move(data),
                   impl->allocator(), /*resizable=*/false);
  torch::NoGradGuard no_grad;
  torch::Tensor out = at::empty({0}, grad.options());
  out.set_(own, grad.storage_offset(), grad.sizes(), grad.strides());
  return out;
}

variable_list FreeConsumedGradients::operator()(const variable_list& outputs,
                                                const variable_list& inputs) {
  for (const torch::Tensor& in : inputs) {
    if (!in.defined() || !in.has_storage()) continue;
    c10::StorageImpl* impl = in.storage().unsafeGetStorageImpl();
    if (std::find(owned_.begin(), owned_.end(), impl) == owned_.end()) {
      continue;
    }
    bool aliased = false;
    for (const torch::Tensor& out : outputs) {
      aliased |= out.defined() && out.has_storage() &&
                 out.storage().unsafeGetStorageImpl() == impl;
    }
    if (!aliased) impl->set_data_ptr(c10::DataPtr(nullptr, impl->device()));
  }
  return outputs;
}

variable_list FreeAccumulatedGradients::operator()(const variable_list& grads) {
  for (c10::StorageImpl* impl : owned_) {
    bool held = false;
    for (const torch::Tensor& g : grads) {
      held |= g.defined() && g.has_storage() &&
              g.storage().unsafeGetStorageImpl() == impl;
    }
    if (!held) impl->set_data_ptr(c10::DataPtr(nullptr, impl->device()));
  }
  return grads;
}

}  // namespace mutwo::worker
