#include "worker/segment_tensors.h"

namespace mutwo::worker {

void AppendTensors(const c10::IValue& value, std::vector<torch::Tensor>* out) {
  if (value.isTensor()) {
    out->push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const torch::Tensor& t : value.toTensorVector()) out->push_back(t);
  } else if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) AppendTensors(v, out);
  } else if (value.isTuple()) {
    for (const c10::IValue& v : value.toTupleRef().elements())
      AppendTensors(v, out);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict())
      AppendTensors(entry.value(), out);
  }
}

c10::DataPtr SharedDataPtr(const c10::Storage& owner) {
  auto* keep = new c10::Storage(owner);
  return c10::DataPtr(
      const_cast<void*>(owner.data()), keep,
      [](void* context) { delete static_cast<c10::Storage*>(context); },
      owner.device());
}

void ShareMemory(const torch::Tensor& copy, const torch::Tensor& original) {
  if (!copy.defined() || !original.defined() || !copy.has_storage() ||
      !original.has_storage() ||
      copy.storage().nbytes() != original.storage().nbytes() ||
      copy.storage_offset() != original.storage_offset() ||
      copy.strides() != original.strides() ||
      copy.storage().device() != original.storage().device() ||
      copy.storage().is_alias_of(original.storage())) {
    return;
  }
  copy.storage().unsafeGetStorageImpl()->set_data_ptr(
      SharedDataPtr(original.storage()));
}

}  // namespace mutwo::worker
