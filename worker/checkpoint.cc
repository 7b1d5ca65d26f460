#include "worker/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/logging.h"
#include "worker/alias.h"
#include "worker/autograd_hooks.h"
#include "worker/gradient_memory.h"
#include "worker/inputs.h"
#include "worker/segment_tensors.h"
#include "worker/swap.h"

namespace mutwo::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::jit::Value;

// `value` with its lists, dicts and tuples copied (tensors shared): what a
// container held when it was read, whatever the graph appends to it later.
c10::IValue Snapshot(const c10::IValue& value) {
  if (value.isList()) {
    auto src = value.toList();
    c10::impl::GenericList list(src.elementType());
    list.reserve(src.size());
    for (const c10::IValue& v : src) list.push_back(Snapshot(v));
    return list;
  }
  if (value.isGenericDict()) {
    auto src = value.toGenericDict();
    c10::impl::GenericDict dict(src.keyType(), src.valueType());
    for (const auto& entry : src) {
      dict.insert(entry.key(), Snapshot(entry.value()));
    }
    return dict;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& v : value.toTupleRef().elements()) {
      elements.push_back(Snapshot(v));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;
}

// Gives the list or dict `target` the contents of `fresh` (same type), in
// place, so that every value aliasing `target` sees them.
void AssignInPlace(const c10::IValue& target, const c10::IValue& fresh) {
  if (target.isList() && fresh.isList()) {
    auto list = target.toList();
    list.clear();
    for (const c10::IValue& v : fresh.toListRef()) list.push_back(v);
  } else if (target.isGenericDict() && fresh.isGenericDict()) {
    auto dict = target.toGenericDict();
    dict.clear();
    for (const auto& entry : fresh.toGenericDict()) {
      dict.insert(entry.key(), entry.value());
    }
  }
}

struct SegmentFunction : public torch::autograd::Function<SegmentFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs,
                               SegmentRun* run) {
    ctx->saved_data["run"] = reinterpret_cast<int64_t>(run);
    ctx->set_materialize_grads(false);
    return run->RunForward(ctx, inputs);
  }
  // By value: the signature torch::autograd::Function documents and calls.
  // NOLINTBEGIN(performance-unnecessary-value-param)
  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    // NOLINTEND(performance-unnecessary-value-param)
    // saved_data holds IValues: the run's address went in as an int64.
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    auto* run = reinterpret_cast<SegmentRun*>(ctx->saved_data["run"].toInt());
    return run->Backward(grad_outputs);
  }
};

}  // namespace

SegmentRun::SegmentRun(const SegmentPlan* plan, const Graph* graph,
                       Interpreter* interpreter,
                       const torch::jit::Module* module,
                       const torch::Device& device)
    : plan_(plan),
      graph_(graph),
      interpreter_(interpreter),
      module_(module),
      device_(device) {}

SegmentRun::~SegmentRun() = default;

c10::IValue SegmentRun::Rebuild(const c10::IValue& shape,
                                const std::vector<torch::Tensor>& tensors,
                                size_t* next) const {
  return RebuildWith(shape, [&]() { return tensors[(*next)++]; });
}

c10::IValue SegmentRun::RebuildWith(
    const c10::IValue& shape,
    const std::function<torch::Tensor()>& next_tensor) const {
  if (shape.isTensor()) return next_tensor();
  if (shape.isTensorList()) {
    c10::List<torch::Tensor> list;
    for (size_t i = 0; i < shape.toTensorList().size(); ++i) {
      list.push_back(next_tensor());
    }
    return list;
  }
  if (shape.isList()) {
    auto src = shape.toList();
    c10::impl::GenericList list(src.elementType());
    for (const c10::IValue& v : src) {
      list.push_back(RebuildWith(v, next_tensor));
    }
    return list;
  }
  if (shape.isGenericDict()) {
    auto src = shape.toGenericDict();
    c10::impl::GenericDict dict(src.keyType(), src.valueType());
    for (const auto& entry : src) {
      dict.insert(entry.key(), RebuildWith(entry.value(), next_tensor));
    }
    return dict;
  }
  if (shape.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& v : shape.toTupleRef().elements()) {
      elements.push_back(RebuildWith(v, next_tensor));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return shape;
}

std::vector<torch::Tensor> SegmentRun::AddedTensors(
    const c10::IValue& value, const std::vector<torch::Tensor>& in,
    std::vector<int>* layout, bool fill) const {
  std::vector<torch::Tensor> all, added;
  AppendTensors(value, &all);
  if (fill) {
    layout->clear();
    for (const torch::Tensor& t : all) {
      int input = -1;
      for (size_t j = 0; j < in.size() && input < 0; ++j) {
        if (in[j].defined() && in[j].is_same(t)) input = static_cast<int>(j);
      }
      layout->push_back(input);
      if (input < 0) added.push_back(t);
    }
    return added;
  }
  if (all.size() != layout->size()) {
    throw std::runtime_error(absl::StrCat(
        "segment ", plan_->segment, ": the replay left ", all.size(),
        " tensors in a list or dict, the forward ", layout->size()));
  }
  for (size_t m = 0; m < all.size(); ++m) {
    if ((*layout)[m] < 0) added.push_back(all[m]);
  }
  return added;
}

void SegmentRun::Forward(InterpreterEnv& env) {
  ExclusiveGradientUseCount();  // the probe runs outside any backward
  std::vector<torch::Tensor> tensors = CaptureInputs(env);
  CollectAttributeTensors();
  for (const torch::Tensor& p : params_) tensors.push_back(p);
  cpu_rng_ = SaveCpuRng();
  cuda_rng_ = SaveDeviceRng(device_);
  replayed_ = false;
  variable_list outputs = SegmentFunction::apply(at::TensorList(tensors), this);
  WriteOutputs(tensors, outputs, env);
  TrackOutputStorages(tensors, outputs);
}

// The input tensors in order (input_shapes_ keeps what each input held, for
// the replay), with which of them are copied and which are module buffers.
std::vector<torch::Tensor> SegmentRun::CaptureInputs(
    const InterpreterEnv& env) {
  input_shapes_.clear();
  tensor_copied_.clear();
  std::vector<torch::Tensor> tensors;
  for (size_t i = 0; i < plan_->inputs.size(); ++i) {
    const c10::IValue& value = env.at(plan_->inputs[i]);
    // A list the graph appends to later must replay with what it held now.
    input_shapes_.push_back(Snapshot(value));
    const size_t before = tensors.size();
    AppendTensors(value, &tensors);
    tensor_copied_.resize(tensors.size(), false);
    for (size_t j = before; j < tensors.size(); ++j) {
      tensor_copied_[j] = plan_->copy_input[i];
    }
  }
  num_input_tensors_ = tensors.size();
  // Buffers read by GetAttr before the range are inputs: batch norm updates
  // them in place (its schema does not say so), so the replay reads copies.
  input_is_buffer_.assign(num_input_tensors_, false);
  {
    size_t j = 0;
    for (size_t i = 0; i < plan_->inputs.size(); ++i) {
      std::vector<torch::Tensor> ts;
      AppendTensors(input_shapes_[i], &ts);
      const bool attr = plan_->inputs[i]->node()->kind() == c10::prim::GetAttr;
      for (const torch::Tensor& t : ts) {
        input_is_buffer_[j++] = attr && t.defined() && !t.requires_grad();
      }
    }
  }
  return tensors;
}

// The parameters (params_, differentiated by the replay) and the other
// tensors (buffer_slots_) the range reads through GetAttr.
void SegmentRun::CollectAttributeTensors() {
  params_.clear();
  buffer_slots_.clear();
  for (const auto& path : plan_->attribute_paths) {
    c10::IValue object = module_->_ivalue();
    for (size_t k = 0; k + 1 < path.size(); ++k) {
      object = object.toObject()->getAttr(path[k]);
    }
    c10::IValue value = object.toObject()->getAttr(path.back());
    if (value.isList()) {
      // A list attribute of parameters (nn.LSTM's `_flat_weights`): the
      // replay differentiates with respect to each of them.
      for (const c10::IValue& element : value.toListRef()) {
        if (!element.isTensor()) continue;
        const torch::Tensor& t = element.toTensor();
        if (!t.defined() || !t.requires_grad()) continue;
        bool seen = false;
        for (const torch::Tensor& p : params_) seen |= p.is_same(t);
        if (!seen) params_.push_back(t);
      }
      continue;
    }
    if (!value.isTensor() || !value.toTensor().defined()) continue;
    const torch::Tensor& t = value.toTensor();
    // The same attribute may be read twice (both branches of an `if`).
    bool seen = false;
    for (const torch::Tensor& p : params_) seen |= p.is_same(t);
    for (const auto& [object, name] : buffer_slots_) {
      seen |= object->getAttr(name).toTensor().is_same(t);
    }
    if (seen) continue;
    if (t.requires_grad()) {
      params_.push_back(t);
    } else {
      buffer_slots_.push_back({object.toObject(), path.back()});
    }
  }
}

// Puts the function's outputs into `env` where the range's outputs were.
void SegmentRun::WriteOutputs(const std::vector<torch::Tensor>& tensors,
                              const variable_list& outputs,
                              InterpreterEnv& env) {
  size_t next = 0;
  for (size_t i = 0; i < plan_->outputs.size(); ++i) {
    if (!plan_->container_output[i]) {
      env[plan_->outputs[i]] = Rebuild(output_shapes_[i], outputs, &next);
      continue;
    }
    // The list or dict itself gets what the range left in it: the tensors
    // it held before (not through the function) and those it added.
    const std::vector<int>& layout = container_layout_[i];
    size_t m = 0;
    const c10::IValue fresh = RebuildWith(output_shapes_[i], [&]() {
      const int j = m < layout.size() ? layout[m] : -1;
      ++m;
      return j >= 0 ? tensors[j] : outputs[next++];
    });
    AssignInPlace(env.at(plan_->outputs[i]), fresh);
  }
}

// The per-output-tensor state the freeing and the replay read: which
// storages may be freed (not an input's, parameter's, buffer's or
// constant's, nor one a written-back container holds), after which node,
// and the nodes that read each.
void SegmentRun::TrackOutputStorages(const std::vector<torch::Tensor>& tensors,
                                     const variable_list& outputs) {
  // Nothing here may keep a tensor alive for the rest of the step: the
  // outputs' storages are the replay's memory after Replay() and must go
  // when autograd is done with them.
  output_shapes_.clear();
  dirty_.clear();
  grad_fn_ = nullptr;
  for (const torch::Tensor& t : outputs) {
    if (t.defined() && t.grad_fn() != nullptr) {
      grad_fn_ = t.grad_fn();
      break;
    }
  }
  // A freeable output may share its storage with an input (a view an op
  // returned), or with a parameter, buffer or tensor constant the range
  // read (`attn_mask = self.mask.unsqueeze(0)`): those are never freed
  // (freeing a buffer's memory would leave the module reading freed memory
  // in later steps).
  absl::flat_hash_set<const c10::StorageImpl*> input_storages;
  for (const torch::Tensor& t : tensors) {  // inputs, then parameters
    if (t.defined() && t.has_storage()) {
      input_storages.insert(t.storage().unsafeGetStorageImpl());
    }
  }
  for (const torch::Tensor& t : BufferTensors()) {
    if (t.has_storage()) {
      input_storages.insert(t.storage().unsafeGetStorageImpl());
    }
  }
  for (const torch::Tensor& t : ConstantTensors()) {
    if (t.has_storage()) {
      input_storages.insert(t.storage().unsafeGetStorageImpl());
    }
  }
  tensor_storage_.clear();
  tensor_impl_.clear();
  tensor_output_.clear();
  tensor_freed_.clear();
  tensor_pinned_by_.clear();
  forward_last_ = -1;
  tail_values_.clear();
  tail_cpu_rng_.clear();
  tail_device_rng_.clear();
  tensor_free_after_.clear();
  freed_bytes_ = 0;
  size_t next = 0;
  for (const torch::Tensor& t : outputs) {
    while (next + 1 < plan_->outputs.size() &&
           output_tensor_end_[next] <= tensor_output_.size()) {
      ++next;
    }
    tensor_output_.push_back(static_cast<int>(next));
    c10::weak_intrusive_ptr<c10::StorageImpl> weak{
        c10::intrusive_ptr<c10::StorageImpl>()};
    if (t.defined() && t.has_storage() &&
        input_storages.count(t.storage().unsafeGetStorageImpl()) == 0) {
      weak = t.storage().getWeakStorageImpl();
    }
    tensor_impl_.push_back(weak.lock().get());
    tensor_storage_.push_back(std::move(weak));
    tensor_freed_.push_back(false);
    tensor_pinned_by_.emplace_back();
    tensor_free_after_.push_back(plan_->free_after[next]);
  }
  // Storages a written-back list or dict holds are read through it (the
  // next DenseNet layer's cat): never freed.
  {
    absl::flat_hash_set<const c10::StorageImpl*> held;
    for (size_t k = 0; k < tensor_output_.size(); ++k) {
      if (plan_->container_output[tensor_output_[k]] && tensor_impl_[k]) {
        held.insert(tensor_impl_[k]);
      }
    }
    for (size_t k = 0; k < tensor_output_.size(); ++k) {
      if (tensor_impl_[k] != nullptr && held.count(tensor_impl_[k]) != 0) {
        tensor_free_after_[k] = std::numeric_limits<int>::max();
      }
    }
  }
  tensor_readers_.clear();
  for (size_t k = 0; k < tensor_output_.size(); ++k) {
    const std::vector<int>& r = plan_->output_readers[tensor_output_[k]];
    tensor_readers_.emplace_back(r.begin(), r.end());
  }
}

std::set<int> SegmentRun::readers(
    const std::function<bool(int, const c10::StorageImpl*)>& may_read) const {
  std::set<int> readers;
  for (size_t k = 0; k < tensor_readers_.size(); ++k) {
    // A storage nobody holds after the forward (not saved by autograd: it
    // died where the plain step frees it) needs no replay for its readers.
    if (tensor_storage_[k].expired()) continue;
    if (tensor_freed_[k] ||
        (!tensor_pinned_by_[k].empty() && plan_->freeable[tensor_output_[k]])) {
      for (int reader : tensor_readers_[k]) {
        if (may_read(reader, tensor_impl_[k])) readers.insert(reader);
      }
    }
  }
  return readers;
}

void SegmentRun::Observe(const std::vector<torch::Tensor>& tensors,
                         int last_use, const std::vector<int>& consumers) {
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    for (size_t k = 0; k < tensor_impl_.size(); ++k) {
      if (tensor_impl_[k] != impl || tensor_freed_[k]) continue;
      tensor_free_after_[k] = std::max(tensor_free_after_[k], last_use);
      tensor_readers_[k].insert(consumers.begin(), consumers.end());
    }
  }
}

void SegmentRun::AddReader(const c10::StorageImpl* storage, int reader) {
  for (size_t k = 0; k < tensor_impl_.size(); ++k) {
    if (tensor_impl_[k] == storage) tensor_readers_[k].insert(reader);
  }
}

void SegmentRun::Pin(const std::vector<torch::Tensor>& tensors,
                     const SegmentRun* by) {
  if (by == this) return;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    for (size_t k = 0; k < tensor_impl_.size(); ++k) {
      if (tensor_impl_[k] == impl && !tensor_freed_[k]) {
        tensor_pinned_by_[k].insert(by);
      }
    }
  }
}

void SegmentRun::Unpin(const SegmentRun* by) {
  for (size_t k = 0; k < tensor_pinned_by_.size(); ++k) {
    if (tensor_pinned_by_[k].erase(by) == 0 || !tensor_pinned_by_[k].empty()) {
      continue;
    }
    // The forward is over when a segment replays; the storage goes now if
    // its last forward use has passed and this segment did not replay yet
    // (its replay would share the memory: freeing it would lose the value).
    if (!replayed_ && !tensor_freed_[k] && plan_->freeable[tensor_output_[k]] &&
        tensor_free_after_[k] <= forward_last_) {
      FreeTensor(k);
    }
  }
}

void SegmentRun::CaptureTail(int node_id, const InterpreterEnv& env) {
  const auto& tail = plan_->tail;
  auto pos = std::find(tail.begin(), tail.end(), node_id);
  if (pos == tail.end()) return;
  ForEachRead(graph_->nodes()[node_id].node, [&](const Value* v) {
    const int producer = graph_->ProducerOf(v);
    if (producer >= plan_->first_node && producer <= plan_->last_node) return;
    if (std::find(tail.begin(), tail.end(), producer) != tail.end()) return;
    auto it = env.find(v);
    if (it != env.end()) tail_values_[v] = it->second;
  });
  tail_cpu_rng_.resize(tail.size());
  tail_device_rng_.resize(tail.size());
  tail_cpu_rng_[pos - tail.begin()] = SaveCpuRng();
  tail_device_rng_[pos - tail.begin()] = SaveDeviceRng(device_);
}

std::vector<torch::Tensor> SegmentRun::tail_tensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& [value, ivalue] : tail_values_) AppendTensors(ivalue, &out);
  return out;
}

variable_list SegmentRun::RunForward(AutogradContext* ctx,
                                     at::TensorList inputs) {
  RECORD_USER_SCOPE(absl::StrCat("mutwo::forward segment ", plan_->segment));
  std::vector<torch::Tensor> tensors(inputs.begin(),
                                     inputs.begin() + num_input_tensors_);
  saved_inputs_.clear();
  input_requires_grad_.clear();
  std::vector<int64_t> versions;
  for (size_t j = 0; j < tensors.size(); ++j) {
    const torch::Tensor& t = tensors[j];
    saved_inputs_.push_back(tensor_copied_[j] && t.defined() ? t.clone() : t);
    MUTWO_LOG(trace, "segment {}: saves input tensor {} ({} B{})",
              plan_->segment, j,
              t.defined() && t.has_storage() ? t.storage().nbytes() : 0,
              tensor_copied_[j] && t.defined() ? ", a copy" : "");
    input_requires_grad_.push_back(t.defined() && t.requires_grad());
    versions.push_back(t.defined() ? t._version() : 0);
  }
  InterpreterEnv env;
  size_t next = 0;
  for (size_t i = 0; i < plan_->inputs.size(); ++i) {
    env[plan_->inputs[i]] = Rebuild(input_shapes_[i], tensors, &next);
  }
  if (read_observer_) {
    for (int id = plan_->first_node; id <= plan_->last_node; ++id) {
      read_observer_(id, env);
      interpreter_->RunRange(id, id, env);
    }
  } else {
    interpreter_->RunRange(plan_->first_node, plan_->last_node, env);
  }
  output_shapes_.clear();
  output_tensor_end_.clear();
  variable_list out;
  container_layout_.assign(plan_->outputs.size(), {});
  for (size_t i = 0; i < plan_->outputs.size(); ++i) {
    const c10::IValue& value = env.at(plan_->outputs[i]);
    output_shapes_.push_back(value);
    if (plan_->container_output[i]) {
      for (torch::Tensor& t :
           AddedTensors(value, tensors, &container_layout_[i], true)) {
        out.push_back(std::move(t));
      }
    } else {
      AppendTensors(value, &out);
    }
    output_tensor_end_.push_back(out.size());
  }
  // An output that is a buffer the range read itself (not through an input:
  // `mask = self.mask` inside an If the range replays) or a tensor constant
  // of the graph (a traced `v + 1e-6` holds 1e-6 as one, read by every
  // later layer norm) goes out as an alias: autograd gives a function's
  // outputs its history, and on the tensor the module or the graph holds
  // that history would outlive the step (the next step's forward reads the
  // buffer and links its graph to this step's freed segment: a use after
  // free) and reach the replay, which reads the same constant: the replay's
  // backward then ran this function's node again, inside its own backward,
  // and waited on its own lock forever (a T5-like model at its floor).
  {
    absl::flat_hash_set<const c10::TensorImpl*> held;
    for (const torch::Tensor& b : BufferTensors()) {
      held.insert(b.unsafeGetTensorImpl());
    }
    for (const torch::Tensor& c : ConstantTensors()) {
      held.insert(c.unsafeGetTensorImpl());
    }
    for (torch::Tensor& t : out) {
      if (t.defined() && held.count(t.unsafeGetTensorImpl()) != 0) {
        t = t.view_as(t);
      }
    }
  }
  variable_list non_differentiable;
  for (const torch::Tensor& t : out) {
    if (t.defined() && !c10::isFloatingType(t.scalar_type()) &&
        !c10::isComplexType(t.scalar_type())) {
      non_differentiable.push_back(t);
    }
  }
  dirty_.clear();
  dirty_index_.clear();
  for (size_t j = 0; j < tensors.size(); ++j) {
    const torch::Tensor& t = tensors[j];
    if (t.defined() && t.requires_grad() && t._version() != versions[j]) {
      dirty_.push_back(t);
      dirty_index_.push_back(j);
      out.push_back(t);
    }
  }
  if (!dirty_.empty()) ctx->mark_dirty(dirty_);
  if (!non_differentiable.empty()) {
    ctx->mark_non_differentiable(non_differentiable);
  }
  return out;
}

std::vector<torch::Tensor> SegmentRun::ConstantTensors() const {
  std::vector<torch::Tensor> out;
  for (int id = plan_->first_node; id <= plan_->last_node; ++id) {
    ForEachNested(graph_->nodes()[id].node, [&](const torch::jit::Node* node) {
      if (node->kind() != c10::prim::Constant ||
          !IsTensorType(node->output()->type())) {
        return;
      }
      // (The interpreter runs a constant as this: the node's own tensor.)
      const std::optional<c10::IValue> value =
          torch::jit::toIValue(node->output());
      if (value.has_value() && value->isTensor() &&
          value->toTensor().defined()) {
        out.push_back(value->toTensor());
      }
    });
  }
  return out;
}

std::vector<torch::Tensor> SegmentRun::BufferTensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& [object, name] : buffer_slots_) {
    const c10::IValue value = object->getAttr(name);
    if (value.isTensor() && value.toTensor().defined()) {
      out.push_back(value.toTensor());
    }
  }
  return out;
}

void SegmentRun::FreeAfter(int node_id) {
  forward_last_ = std::max(forward_last_, node_id);
  for (size_t k = 0; k < tensor_storage_.size(); ++k) {
    const int output = tensor_output_[k];
    if (tensor_freed_[k] || !tensor_pinned_by_[k].empty() ||
        !plan_->freeable[output] || tensor_free_after_[k] > node_id) {
      continue;
    }
    FreeTensor(k);
  }
}

void SegmentRun::FreeTensor(size_t k) {
  c10::intrusive_ptr<c10::StorageImpl> impl = tensor_storage_[k].lock();
  if (!impl || impl->data() == nullptr) return;
  MUTWO_LOG(trace, "segment {}: free output tensor {} ({} B)", plan_->segment,
            k, impl->nbytes());
  freed_bytes_ += static_cast<int64_t>(impl->nbytes());
  impl->set_data_ptr(c10::DataPtr(nullptr, impl->device()));
  tensor_freed_[k] = true;
  // Other output tensors of the same storage are freed with it.
  for (size_t j = 0; j < tensor_storage_.size(); ++j) {
    auto other = tensor_storage_[j].lock();
    if (other && other.get() == impl.get()) tensor_freed_[j] = true;
  }
}

}  // namespace mutwo::worker
