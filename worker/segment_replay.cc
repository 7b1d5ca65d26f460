// SegmentRun's replay and backward (checkpoint.h): the range run again with
// autograd on, the freed storages given back, and the backward through the
// replay. The forward run is checkpoint.cc's.
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/logging.h"
#include "worker/alias.h"
#include "worker/autograd_hooks.h"
#include "worker/checkpoint.h"
#include "worker/gradient_memory.h"
#include "worker/segment_tensors.h"
#include "worker/swap.h"

namespace mutwo::worker {

using torch::autograd::variable_list;
using torch::jit::Value;

void SegmentRun::RunRangeWithHooks(InterpreterEnv& env) {
  // Autograd nodes already reachable (the leaves' and earlier nodes') are
  // not attributed to a later node.
  absl::flat_hash_set<const torch::autograd::Node*> seen;
  for (int id = plan_->first_node; id <= plan_->last_node; ++id) {
    const torch::jit::Node* node = graph_->nodes()[id].node;
    auto hooks = replay_hooks_.find(id);
    std::vector<torch::Tensor> made;
    // Outputs may be dropped by RunRange right after the node (dead there):
    // nothing reads them then, and nothing needs a hook.
    interpreter_->RunRange(id, id, env);
    for (const Value* out : node->outputs()) {
      auto it = env.find(out);
      if (it != env.end()) AppendTensors(it->second, &made);
    }
    std::vector<torch::autograd::Node*> stack;
    std::vector<torch::autograd::Node*> found;
    for (const torch::Tensor& t : made) {
      if (!t.defined() || t.grad_fn() == nullptr) continue;
      torch::autograd::Node* fn = t.grad_fn().get();
      if (seen.insert(fn).second) stack.push_back(fn);
    }
    while (!stack.empty()) {
      torch::autograd::Node* fn = stack.back();
      stack.pop_back();
      // A parameter's accumulator outlives the step: no hook there.
      if (dynamic_cast<torch::autograd::AccumulateGrad*>(fn) != nullptr) {
        continue;
      }
      found.push_back(fn);
      for (const auto& edge : fn->next_edges()) {
        torch::autograd::Node* next = edge.function.get();
        if (next != nullptr && seen.insert(next).second) stack.push_back(next);
      }
    }
    if (hooks == replay_hooks_.end()) continue;
    for (torch::autograd::Node* fn : found) {
      for (const std::function<void()>& hook : hooks->second) {
        fn->add_pre_hook(std::make_unique<CallbackPreHook>(hook));
      }
    }
  }
}

void SegmentRun::Replay() {
  if (replayed_) return;
  RECORD_USER_SCOPE(absl::StrCat("mutwo::replay segment ", plan_->segment));
  replayed_ = true;
  if (before_replay_) before_replay_();
  CheckInputsResident();
  std::vector<c10::IValue> originals = CopyBuffersForReplay();
  const std::string cpu_now = SaveCpuRng();
  const torch::Tensor device_now = SaveDeviceRng(device_);
  RestoreCpuRng(cpu_rng_);
  RestoreDeviceRng(device_, cuda_rng_);
  replay_leaves_.clear();
  replay_roots_.clear();
  // Per input: a buffer's copy fed to the replay, and the buffer.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffer_feeds;
  std::vector<torch::Tensor> replay_outputs = RunReplay(&buffer_feeds);
  // The replay's graph holds what its backward reads; the inputs are not
  // needed any more (Backward() only needs the leaves it differentiates).
  input_shapes_.clear();
  saved_inputs_.clear();
  for (size_t j = 0; j < replay_leaves_.size(); ++j) {
    if (!input_requires_grad_[j]) replay_leaves_[j] = torch::Tensor();
  }
  RestoreCpuRng(cpu_now);
  RestoreDeviceRng(device_, device_now);
  RestoreBuffers(originals, buffer_feeds);
  GiveOutputsReplayMemory(replay_outputs);
  for (const torch::Tensor& t : replay_outputs) {
    ReplayRoot root;
    if (t.defined() && t.requires_grad()) {
      root.differentiable = true;
      root.leaf = t.grad_fn() == nullptr;
      root.edge = torch::autograd::impl::gradient_edge(t);
    }
    replay_roots_.push_back(std::move(root));
  }
  replay_outputs.clear();
  if (after_replay_) after_replay_();
}

// Inputs stay resident until the replay read them; a DCHECK build says
// which one was freed too early instead of replaying from freed memory.
void SegmentRun::CheckInputsResident() const {
  for (size_t j = 0; j < saved_inputs_.size(); ++j) {
    const torch::Tensor& t = saved_inputs_[j];
    MUTWO_DCHECK(!t.defined() || !t.has_storage() ||
                 t.storage().nbytes() == 0 || t.storage().data() != nullptr)
        << "segment " << plan_->segment << ": the replay reads input tensor "
        << j << ", whose storage was freed";
  }
}

// The replay updates copies of the buffers (batch-norm running statistics):
// the real ones were updated once, by the forward run, and keep their
// versions (autograd nodes saved them). Returns the real ones, in
// buffer_slots_ order, for RestoreBuffers.
std::vector<c10::IValue> SegmentRun::CopyBuffersForReplay() {
  std::vector<c10::IValue> originals;
  torch::NoGradGuard no_grad;
  for (const auto& [object, name] : buffer_slots_) {
    originals.push_back(object->getAttr(name));
    object->setAttr(name, originals.back().toTensor().clone());
  }
  return originals;
}

// The range run again with autograd on, from leaves made of the saved
// inputs; returns the replay's output tensors in the forward's order (the
// range's outputs, then the inputs written in place) and fills
// `buffer_feeds` (per input: a buffer's copy fed to the replay, and the
// buffer).
std::vector<torch::Tensor> SegmentRun::RunReplay(
    std::vector<std::pair<torch::Tensor, torch::Tensor>>* buffer_feeds_out) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>>& buffer_feeds =
      *buffer_feeds_out;
  std::vector<torch::Tensor> replay_outputs;
  torch::AutoGradMode grad_mode(true);
  std::vector<torch::Tensor> feeds;
  buffer_feeds.assign(saved_inputs_.size(), {});
  for (size_t j = 0; j < saved_inputs_.size(); ++j) {
    const torch::Tensor& t = saved_inputs_[j];
    if (!t.defined()) {
      replay_leaves_.push_back(t);
      feeds.push_back(t);
      continue;
    }
    torch::Tensor leaf = t.detach();
    const bool grad = input_requires_grad_[j];
    if (grad) leaf.requires_grad_(true);
    replay_leaves_.push_back(leaf);
    // In-place ops on a leaf that requires grad are refused, and buffers
    // must not be updated twice: feed copies.
    feeds.push_back((grad && tensor_copied_[j]) || input_is_buffer_[j]
                        ? leaf.clone()
                        : leaf);
    if (input_is_buffer_[j] && !(grad && tensor_copied_[j])) {
      buffer_feeds[j] = {feeds.back(), leaf};
    }
  }
  InterpreterEnv env;
  size_t next = 0;
  for (size_t i = 0; i < plan_->inputs.size(); ++i) {
    env[plan_->inputs[i]] = Rebuild(input_shapes_[i], feeds, &next);
  }
  if (replay_hooks_.empty()) {
    interpreter_->RunRange(plan_->first_node, plan_->last_node, env);
  } else {
    RunRangeWithHooks(env);
  }
  for (size_t i = 0; i < plan_->outputs.size(); ++i) {
    const c10::IValue& value = env.at(plan_->outputs[i]);
    if (plan_->container_output[i]) {
      for (torch::Tensor& t :
           AddedTensors(value, {}, &container_layout_[i], false)) {
        replay_outputs.push_back(std::move(t));
      }
    } else {
      AppendTensors(value, &replay_outputs);
    }
  }
  // Inputs the forward wrote in place are outputs too (after the range's
  // outputs, as in RunForward).
  for (size_t j : dirty_index_) replay_outputs.push_back(feeds[j]);
  RunTail(env);
  return replay_outputs;
}

// The tail rebuilds what autograd saved after the range (its own backward
// nodes were recorded in forward): values only, in place into the replayed
// outputs, from what it captured (buffers as copies).
void SegmentRun::RunTail(InterpreterEnv& env) {
  if (plan_->tail.empty()) return;
  torch::NoGradGuard no_grad;
  for (size_t t = 0; t < plan_->tail.size(); ++t) {
    const int id = plan_->tail[t];
    ForEachRead(graph_->nodes()[id].node, [&](const Value* v) {
      if (env.count(v) != 0) return;
      auto it = tail_values_.find(v);
      if (it == tail_values_.end()) return;
      c10::IValue value = it->second;
      if (v->node()->kind() == c10::prim::GetAttr && value.isTensor() &&
          value.toTensor().defined() && !value.toTensor().requires_grad()) {
        value = value.toTensor().clone();
      }
      env[v] = value;
    });
    if (t < tail_cpu_rng_.size()) {
      RestoreCpuRng(tail_cpu_rng_[t]);
      RestoreDeviceRng(device_, tail_device_rng_[t]);
    }
    interpreter_->RunRange(id, id, env);
  }
  tail_values_.clear();
}

// The copies the replay updated are saved by its graph (batch norm saves the
// running statistics): they read the real buffers' memory from now on, so
// the copies take no memory while the replay's backward waits.
void SegmentRun::RestoreBuffers(
    const std::vector<c10::IValue>& originals,
    const std::vector<std::pair<torch::Tensor, torch::Tensor>>& buffer_feeds) {
  for (size_t i = 0; i < buffer_slots_.size(); ++i) {
    const c10::IValue copy =
        buffer_slots_[i].first->getAttr(buffer_slots_[i].second);
    if (copy.isTensor()) ShareMemory(copy.toTensor(), originals[i].toTensor());
    buffer_slots_[i].first->setAttr(buffer_slots_[i].second, originals[i]);
  }
  for (const auto& [copy, buffer] : buffer_feeds) ShareMemory(copy, buffer);
}

// Freed outputs get the replay's memory. Outputs the forward kept (read by
// a later segment, or never freed) hold the values the replay computed
// again: the replay uses their memory instead of holding a second copy
// (unless a later in-place write changed them).
void SegmentRun::GiveOutputsReplayMemory(
    const std::vector<torch::Tensor>& replay_outputs) {
  for (size_t k = 0; k < tensor_storage_.size(); ++k) {
    c10::intrusive_ptr<c10::StorageImpl> impl = tensor_storage_[k].lock();
    if (!impl) continue;
    const torch::Tensor& fresh = replay_outputs[k];
    if (!tensor_freed_[k]) {
      if (fresh.defined() && fresh.has_storage() && impl->data() != nullptr &&
          !plan_->written_after[tensor_output_[k]] &&
          fresh.storage().nbytes() == impl->nbytes() &&
          fresh.storage().device() == impl->device() &&
          fresh.storage().data() != impl->data()) {
        fresh.storage().unsafeGetStorageImpl()->set_data_ptr(
            SharedDataPtr(c10::Storage(impl)));
      }
      continue;
    }
    if (fresh.storage().nbytes() != impl->nbytes()) {
      throw std::runtime_error(
          absl::StrCat("segment ", plan_->segment, ": the replay of output ", k,
                       " has ", fresh.storage().nbytes(),
                       " bytes, the forward had ", impl->nbytes()));
    }
    impl->set_data_ptr(SharedDataPtr(fresh.storage()));
    freed_bytes_ -= static_cast<int64_t>(impl->nbytes());
    tensor_freed_[k] = false;
  }
}

variable_list SegmentRun::Backward(const variable_list& grad_outputs) {
  Replay();
  RECORD_USER_SCOPE(absl::StrCat("mutwo::backward segment ", plan_->segment));
  // The replay's backward runs on gradient edges, not on the replayed
  // outputs: Replay() dropped them, so each lives only as long as the
  // replay's graph needs it (as in the plain step). Incoming gradients that
  // only the engine holds are moved into tensors of our own and freed once
  // the node that consumes them ran.
  torch::autograd::edge_list roots;
  variable_list grads;
  absl::flat_hash_map<torch::autograd::Node*, std::vector<c10::StorageImpl*>>
      owned_by_root;
  for (size_t k = 0; k < replay_roots_.size() && k < grad_outputs.size(); ++k) {
    const ReplayRoot& root = replay_roots_[k];
    if (!root.differentiable || !grad_outputs[k].defined()) continue;
    roots.push_back(root.edge);
    // (The engine copies the gradients of a node with post hooks: the
    // probe's count does not hold for it. An output that is a leaf, a
    // parameter or an input the segment passes through, has its gradient
    // captured as the result: it must not be freed once consumed.)
    torch::Tensor grad =
        !root.leaf && grad_fn_ != nullptr && grad_fn_->post_hooks().empty()
            ? TakeGradient(grad_outputs[k])
            : grad_outputs[k];
    if (!grad.is_same(grad_outputs[k])) {
      owned_by_root[roots.back().function.get()].push_back(
          grad.storage().unsafeGetStorageImpl());
    }
    grads.push_back(std::move(grad));
  }
  torch::autograd::edge_list wrt;
  std::vector<size_t> wrt_index;  // position among the function's inputs
  auto add_wrt = [&](const torch::Tensor& t, size_t index) {
    std::shared_ptr<torch::autograd::Node> fn = t.grad_fn();
    if (!fn) fn = torch::autograd::impl::try_get_grad_accumulator(t);
    if (!fn) return;  // not reached by the replay: no gradient
    wrt.emplace_back(std::move(fn), t.output_nr());
    wrt_index.push_back(index);
  };
  for (size_t j = 0; j < replay_leaves_.size(); ++j) {
    if (replay_leaves_[j].defined() && replay_leaves_[j].requires_grad()) {
      add_wrt(replay_leaves_[j], j);
    }
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    add_wrt(params_[p], num_input_tensors_ + p);
  }
  replay_roots_.clear();
  for (const auto& [root, owned] : owned_by_root) {
    root->add_pre_hook(std::make_unique<FreeAccumulatedGradients>(owned));
    root->add_post_hook(std::make_unique<FreeConsumedGradients>(owned));
  }
  variable_list result(num_input_tensors_ + params_.size() + 1);
  if (!roots.empty() && !wrt.empty()) {
    variable_list computed =
        torch::autograd::Engine::get_default_engine().execute(
            roots, grads, /*keep_graph=*/false, /*create_graph=*/false,
            /*accumulate_grad=*/false, wrt);
    for (size_t i = 0; i < computed.size(); ++i) {
      result[wrt_index[i]] = computed[i];
    }
  }
  replay_leaves_.clear();
  saved_inputs_.clear();
  return result;
}

}  // namespace mutwo::worker
