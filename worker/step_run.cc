#include "worker/step_run.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/alias.h"
#include "worker/autograd_hooks.h"
#include "worker/inputs.h"

namespace mutwo::worker {
namespace {

using torch::autograd::Node;
using torch::jit::Value;

std::vector<std::shared_ptr<Node>> Alive(
    const std::vector<std::weak_ptr<Node>>& nodes) {
  std::vector<std::shared_ptr<Node>> out;
  for (const std::weak_ptr<Node>& weak : nodes) {
    if (std::shared_ptr<Node> fn = weak.lock()) out.push_back(std::move(fn));
  }
  return out;
}

std::vector<torch::Tensor> TensorsOf(const std::vector<c10::IValue>& values) {
  std::vector<torch::Tensor> out;
  for (const c10::IValue& v : values) {
    for (const torch::Tensor& t : FlattenTensors(v)) out.push_back(t);
  }
  return out;
}

// Calls `fn` with the storage of every tensor `node` reads from `env`
// (inside its blocks too), once per tensor.
template <typename Fn>
void ForEachStorageRead(const torch::jit::Node* node, const InterpreterEnv& env,
                        const Fn& fn) {
  ForEachRead(node, [&](const Value* v) {
    auto it = env.find(v);
    if (it == env.end()) return;
    for (const torch::Tensor& t : FlattenTensors(it->second)) {
      if (t.defined() && t.has_storage()) {
        fn(t.storage().unsafeGetStorageImpl());
      }
    }
  });
}

}  // namespace

StepRun::StepRun(const StepContext& context, bool tracing)
    : ctx_(context), compiled_(*context.compiled), tracing_(tracing) {
  made_by_.assign(ctx_.graph->num_nodes(), {});
  for (size_t s = 0; s < compiled_.segments.size(); ++s) {
    segments_.push_back(std::make_unique<SegmentRun>(
        &compiled_.segments[s], ctx_.graph, ctx_.interpreter, ctx_.module,
        ctx_.device));
    segment_starting_at_[compiled_.segments[s].first_node] =
        static_cast<int>(s);
    for (int k : compiled_.segments[s].tail) {
      tail_at_[k].push_back(static_cast<int>(s));
    }
  }
  stashes_.resize(compiled_.swaps.size());
  offloaded_.assign(compiled_.swaps.size(), false);
  swap_readers_.resize(compiled_.swaps.size());
  reader_.assign(ctx_.graph->num_nodes(), false);
  auto mark_readers = [this](const std::vector<int>& readers) {
    for (int r : readers) {
      if (r >= 0 && r < static_cast<int>(reader_.size())) reader_[r] = true;
    }
  };
  for (const SegmentPlan& plan : compiled_.segments) {
    for (const std::vector<int>& readers : plan.output_readers) {
      mark_readers(readers);
    }
  }
  for (size_t i = 0; i < compiled_.swaps.size(); ++i) {
    const SwapPlan& swap = compiled_.swaps[i];
    swap_free_after_.push_back(swap.offload_after);
    swap_readers_[i].insert(swap.readers.begin(), swap.readers.end());
    mark_readers(swap.readers);
    swaps_of_producer_[swap.producer].push_back(i);
  }
  WireReplays();
  for (size_t s = 0; s < segments_.size(); ++s) {
    segments_[s]->set_read_observer(
        [this, s](int id, const InterpreterEnv& env) {
          RecordReads(id, env);
          RecordSegmentReads(s, id, env);
        });
  }
}

void StepRun::WireReplays() {
  // Swapped storages a replay reads come back first.
  for (size_t s = 0; s < segments_.size(); ++s) {
    SegmentRun* seg = segments_[s].get();
    // The parts of one planner segment (execution_plan.h: a group split
    // at an in-place write) replay together, where the planner replays
    // the whole: at its members' first need.
    std::vector<SegmentRun*> siblings;
    for (size_t o = 0; o < segments_.size(); ++o) {
      if (o != s &&
          compiled_.segments[o].segment == compiled_.segments[s].segment) {
        siblings.push_back(segments_[o].get());
      }
    }
    seg->set_before_replay([this, seg]() {
      Storages needed;
      std::vector<torch::Tensor> inputs = seg->saved_inputs();
      for (const torch::Tensor& t : seg->tail_tensors()) inputs.push_back(t);
      for (const torch::Tensor& t : inputs) {
        if (t.defined() && t.has_storage()) {
          needed.insert(t.storage().unsafeGetStorageImpl());
        }
      }
      for (auto& list : stashes_) {
        for (auto& stash : list) {
          if (stash->offloaded() && needed.count(stash->storage()) > 0) {
            stash->Restore();
          }
        }
      }
    });
    // What it pinned in other segments can go once it replayed.
    seg->set_after_replay([this, seg, siblings]() {
      for (auto& other : segments_) other->Unpin(seg);
      for (SegmentRun* sibling : siblings) sibling->Replay();
    });
  }
}

InterpreterHooks StepRun::ForwardHooks() {
  InterpreterHooks hooks;
  // Nothing to run differently, free or hook (TraceBackward hooks every
  // node: it needs what Discover finds).
  if (segments_.empty() && compiled_.swaps.empty() &&
      !spdlog::should_log(spdlog::level::trace)) {
    return hooks;
  }
  hooks.take_over = [this](int id, InterpreterEnv& env) {
    return TakeOver(id, env);
  };
  hooks.before_node = [this](int id) { BeforeNode(id); };
  hooks.after_node = [this](int id, std::vector<c10::IValue>& outputs) {
    AfterNode(id, outputs);
  };
  return hooks;
}

void StepRun::Offload(size_t i, int last) {
  RECORD_USER_SCOPE(
      absl::StrCat("mutwo::offload value ", compiled_.swaps[i].value_id));
  offloaded_[i] = true;
  int64_t offloaded_bytes = 0;
  for (auto& stash : stashes_[i]) {
    stash->Offload();
    if (stash->offloaded()) offloaded_bytes += stash->nbytes();
  }
  swapped_bytes_ += offloaded_bytes;
  MUTWO_LOG(
      trace, "swap value {}: offloaded after node {}: {} B of {} storages",
      compiled_.swaps[i].value_id, last, offloaded_bytes, stashes_[i].size());
}

void StepRun::FreeAfter(int last) {
  for (auto& segment : segments_) segment->FreeAfter(last);
  for (size_t i = 0; i < compiled_.swaps.size(); ++i) {
    if (offloaded_[i] || swap_free_after_[i] > last) continue;
    Offload(i, last);
  }
}

// A swap past the planner's offload point that waits only for the static
// readers of containers it may sit in (which dict entry a node reads is
// not known before it runs: torchvision's feature dicts) goes as soon as no
// value the rest of the forward can read holds its storages. The
// interpreter drops values after their last use, so what `env` holds
// before node `id` is all that nodes from `id` on read.
void StepRun::OffloadUnheld(int id, const InterpreterEnv& env) {
  std::vector<size_t> waiting;
  for (size_t i = 0; i < compiled_.swaps.size(); ++i) {
    if (!offloaded_[i] && !stashes_[i].empty() &&
        compiled_.swaps[i].planned_offload_after < id &&
        swap_free_after_[i] >= id) {
      waiting.push_back(i);
    }
  }
  if (waiting.empty()) return;
  Storages held;
  for (const auto& [value, ivalue] : env) {
    for (const torch::Tensor& t : FlattenTensors(ivalue)) {
      if (t.defined() && t.has_storage()) {
        held.insert(t.storage().unsafeGetStorageImpl());
      }
    }
  }
  for (size_t i : waiting) {
    bool still_held = false;
    for (const auto& stash : stashes_[i]) {
      still_held |= held.count(stash->storage()) > 0;
    }
    if (!still_held) Offload(i, id - 1);
  }
}

void StepRun::RegisterSwaps(
    int first, int last,
    const std::function<const c10::IValue*(const Value*)>& find) {
  for (size_t i = 0; i < compiled_.swaps.size(); ++i) {
    const int p = compiled_.swaps[i].producer;
    if (p < first || p > last) continue;
    std::vector<c10::IValue> values;
    for (const Value* out : compiled_.swaps[i].values) {
      if (const c10::IValue* value = find(out)) values.push_back(*value);
    }
    Storages seen;
    for (const torch::Tensor& t : TensorsOf(values)) {
      if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) {
        continue;
      }
      if (!seen.insert(t.storage().unsafeGetStorageImpl()).second) continue;
      stashes_[i].push_back(MakeHostStash(t.storage(), ctx_.device));
      watched_.insert(stashes_[i].back()->storage());
    }
  }
}

bool StepRun::Watched(const std::vector<torch::Tensor>& tensors) const {
  for (const torch::Tensor& t : tensors) {
    if (t.defined() && t.has_storage() &&
        watched_.contains(t.storage().unsafeGetStorageImpl())) {
      return true;
    }
  }
  return false;
}

// Any later value sharing a storage the schedule frees keeps it alive until
// its own last use; its readers need it back in backward.
void StepRun::Observe(int first, int last,
                      const std::vector<torch::Tensor>& tensors) {
  int last_use = 0;
  std::set<int> consumers;
  for (int id = first; id <= last; ++id) {
    const IrNode& ir = ctx_.graph->nodes()[id];
    last_use =
        std::max(last_use, ir.returns_output ? std::numeric_limits<int>::max()
                                             : ir.last_use);
    for (int c : ir.consumers) {
      if (c > last) consumers.insert(c);
    }
  }
  const std::vector<int> readers(consumers.begin(), consumers.end());
  // Their backward may need a replay or a copy back: record what they read.
  for (int r : readers) reader_[r] = true;
  for (size_t s = 0; s < segments_.size(); ++s) {
    if (compiled_.segments[s].last_node < first) {
      segments_[s]->Observe(tensors, last_use, readers);
    }
  }
  for (size_t i = 0; i < compiled_.swaps.size(); ++i) {
    if (offloaded_[i] || stashes_[i].empty()) continue;
    for (const torch::Tensor& t : tensors) {
      if (!t.defined() || !t.has_storage()) continue;
      for (const auto& stash : stashes_[i]) {
        if (stash->storage() != t.storage().unsafeGetStorageImpl()) continue;
        swap_free_after_[i] = std::max(swap_free_after_[i], last_use);
        swap_readers_[i].insert(readers.begin(), readers.end());
      }
    }
  }
}

// What each node reads in forward (top-level nodes here, a segment's nodes
// in its forward run).
void StepRun::RecordReads(int id, const InterpreterEnv& env) {
  if (!reader_[id]) return;  // no hook asks MayRead about it
  Storages& read = reads_[id];
  ForEachStorageRead(
      ctx_.graph->nodes()[id].node, env,
      [&](const c10::StorageImpl* storage) { read.insert(storage); });
}

// A node inside a segment may read an earlier segment's output through an
// alias made at run time inside its own segment (dropout of probability 0
// returns its input itself; no schema says so): that node is not among the
// output's static readers, and the segment's forward hides the alias from
// Observe. Without it as a reader, the storage freed once this segment
// replayed (Unpin) stays freed when the replay's backward reads it.
void StepRun::RecordSegmentReads(size_t s, int id, const InterpreterEnv& env) {
  // (An alias made inside the segment shares an input's storage: only the
  // inputs that earlier segments made are looked for, most segments none.)
  if (inputs_from_segments_.empty()) return;
  const int first = compiled_.segments[s].first_node;
  ForEachStorageRead(
      ctx_.graph->nodes()[id].node, env, [&](const c10::StorageImpl* storage) {
        if (!inputs_from_segments_.contains(storage)) return;
        for (size_t o = 0; o < segments_.size(); ++o) {
          if (o != s && compiled_.segments[o].last_node < first) {
            segments_[o]->AddReader(storage, id);
          }
        }
      });
}

void StepRun::Discover(int first, int last,
                       const std::vector<torch::Tensor>& tensors) {
  std::vector<std::weak_ptr<Node>> found;
  std::vector<std::shared_ptr<Node>> stack;
  // First seen now (or the node seen at its address died).
  auto fresh = [this](const std::shared_ptr<Node>& fn) {
    auto [it, inserted] = seen_.try_emplace(fn.get(), fn);
    if (inserted) return true;
    if (!it->second.expired()) return false;
    it->second = fn;
    return true;
  };
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || t.grad_fn() == nullptr) continue;
    if (fresh(t.grad_fn())) stack.push_back(t.grad_fn());
  }
  while (!stack.empty()) {
    std::shared_ptr<Node> fn = std::move(stack.back());
    stack.pop_back();
    found.push_back(fn);
    for (const auto& edge : fn->next_edges()) {
      if (edge.function != nullptr && fresh(edge.function)) {
        stack.push_back(edge.function);
      }
    }
  }
  if (found.empty()) return;
  for (int id = first; id <= last; ++id) {
    made_by_[id].insert(made_by_[id].end(), found.begin(), found.end());
  }
}

int StepRun::TakeOver(int id, InterpreterEnv& env) {
  OffloadUnheld(id, env);
  if (segment_starting_at_.count(id) == 0) RecordReads(id, env);
  // Tail nodes of earlier segments: what they read is kept (and stays
  // resident) until that segment's replay.
  if (auto tail = tail_at_.find(id); tail != tail_at_.end()) {
    for (int s : tail->second) {
      SegmentRun* owner = segments_[s].get();
      owner->CaptureTail(id, env);
      const std::vector<torch::Tensor> captured = owner->tail_tensors();
      for (auto& other : segments_) other->Pin(captured, owner);
    }
  }
  auto it = segment_starting_at_.find(id);
  if (it == segment_starting_at_.end()) return -1;
  SegmentRun* seg = segments_[it->second].get();
  const SegmentPlan& plan = compiled_.segments[it->second];
  *ctx_.current_step =
      absl::StrCat("recompute segment ", plan.segment, " (nodes ",
                   plan.first_node, "..", plan.last_node, ")");
  {
    std::vector<c10::IValue> inputs;
    for (const Value* v : plan.inputs) inputs.push_back(env.at(v));
    const std::vector<torch::Tensor> tensors = TensorsOf(inputs);
    for (auto& earlier : segments_) earlier->Pin(tensors, seg);
    inputs_from_segments_.clear();
    for (const torch::Tensor& t : tensors) {
      if (t.defined() && t.has_storage() &&
          segment_outputs_.contains(t.storage().unsafeGetStorageImpl())) {
        inputs_from_segments_.insert(t.storage().unsafeGetStorageImpl());
      }
    }
  }
  if (tracing_) ctx_.backend->SetTag(plan.first_node);
  seg->Forward(env);
  *ctx_.current_step = "forward";
  for (const c10::StorageImpl* storage : seg->output_storages()) {
    if (storage != nullptr) {
      watched_.insert(storage);
      segment_outputs_.insert(storage);
    }
  }
  std::vector<c10::IValue> outputs;
  for (const Value* v : plan.outputs) outputs.push_back(env.at(v));
  const std::vector<torch::Tensor> tensors = TensorsOf(outputs);
  Discover(plan.first_node, plan.last_node, tensors);
  RegisterSwaps(plan.first_node, plan.last_node,
                [&env](const Value* v) -> const c10::IValue* {
                  auto it = env.find(v);
                  return it == env.end() ? nullptr : &it->second;
                });
  Observe(plan.first_node, plan.last_node, tensors);
  FreeAfter(plan.last_node);
  MUTWO_LOG(trace, "forward node {}: {} B after (segment {}; peak {} B)",
            plan.last_node, ctx_.backend->AllocatedBytes(), plan.segment,
            ctx_.backend->PeakBytes());
  return plan.last_node;
}

// (The interpreter's errors name the node: no per-node description here.)
void StepRun::BeforeNode(int id) {
  if (tracing_) ctx_.backend->SetTag(id);
}

void StepRun::AfterNode(int id, std::vector<c10::IValue>& outputs) {
  const std::vector<torch::Tensor> tensors = TensorsOf(outputs);
  Discover(id, id, tensors);
  if (swaps_of_producer_.contains(id)) {
    const auto& values = ctx_.graph->nodes()[id].node->outputs();
    RegisterSwaps(id, id, [&](const Value* v) -> const c10::IValue* {
      for (size_t i = 0; i < values.size() && i < outputs.size(); ++i) {
        if (values[i] == v) return &outputs[i];
      }
      return nullptr;
    });
  }
  if (Watched(tensors)) Observe(id, id, tensors);
  FreeAfter(id);
  MUTWO_LOG(trace, "forward node {}: {} B after (peak {} B)", id,
            ctx_.backend->AllocatedBytes(), ctx_.backend->PeakBytes());
}

bool StepRun::MayRead(int reader, const c10::StorageImpl* storage) const {
  auto it = reads_.find(reader);
  return it == reads_.end() || it->second.count(storage) != 0;
}

void StepRun::HookBackward() {
  for (size_t s = 0; s < compiled_.segments.size(); ++s) HookReplay(s);
  for (size_t i = 0; i < compiled_.swaps.size(); ++i) HookSwap(i);
}

void StepRun::HookReplay(size_t s) {
  SegmentRun* seg = segments_[s].get();
  for (int reader :
       seg->readers([this](int reader, const c10::StorageImpl*storage) {
         return MayRead(reader, storage);
       })) {
    // A reader inside another segment's range runs in that segment's
    // replay: the hook goes on the replay's nodes it makes, so this
    // segment replays where that backward reaches the reader (the
    // planner's position), not before the whole of it.
    const int inside = compiled_.SegmentHolding(reader);
    // (`--log_level trace`: the memory around each replay.)
    const int id = compiled_.segments[s].segment;
    DeviceBackend* backend = ctx_.backend;
    auto replay = [backend, seg, id, reader]() {
      if (seg->replayed()) return;
      MUTWO_LOG(trace, "replay segment {} for node {}: {} B before", id, reader,
                backend->AllocatedBytes());
      seg->Replay();
      MUTWO_LOG(trace, "replay segment {}: {} B after (peak {} B)", id,
                backend->AllocatedBytes(), backend->PeakBytes());
    };
    if (inside >= 0 && inside != static_cast<int>(s)) {
      segments_[inside]->AddReplayHook(reader, replay);
      continue;
    }
    for (const std::shared_ptr<Node>& fn : Alive(made_by_[reader])) {
      fn->add_pre_hook(std::make_unique<CallbackPreHook>(replay));
    }
  }
}

void StepRun::HookSwap(size_t i) {
  std::vector<int> nodes;
  for (int reader : swap_readers_[i]) {
    for (const auto& stash : stashes_[i]) {
      if (MayRead(reader, stash->storage())) {
        nodes.push_back(reader);
        break;
      }
    }
  }
  const int producer = compiled_.swaps[i].producer;
  // A node inside a recompute segment's range (not the producer's own
  // segment) gets the hook on the nodes its replay makes: the segment's
  // function runs the backward of its whole range, so a hook on it would
  // copy back when that starts, not at the node's step (a ResNet-152
  // prefetch planned at a block's first convolution came back at its last
  // one: +12% at the floor on the H100).
  const int producer_segment = compiled_.SegmentHolding(producer);
  auto replaying_segment = [&](int node) -> SegmentRun* {
    const int o = compiled_.SegmentHolding(node);
    return o >= 0 && o != producer_segment ? segments_[o].get() : nullptr;
  };
  auto restore = [this, i]() {
    RECORD_USER_SCOPE(
        absl::StrCat("mutwo::restore value ", compiled_.swaps[i].value_id));
    MUTWO_LOG(trace, "swap value {}: restore", compiled_.swaps[i].value_id);
    for (auto& stash : stashes_[i]) stash->Restore();
  };
  auto prefetch = [this, i]() {
    RECORD_USER_SCOPE(
        absl::StrCat("mutwo::prefetch value ", compiled_.swaps[i].value_id));
    MUTWO_LOG(trace, "swap value {}: prefetch", compiled_.swaps[i].value_id);
    for (auto& stash : stashes_[i]) stash->Prefetch();
  };
  absl::flat_hash_set<Node*> hooked;
  for (int node : nodes) {
    if (SegmentRun* seg = replaying_segment(node)) {
      seg->AddReplayHook(node, restore);
      continue;
    }
    for (const std::shared_ptr<Node>& fn : Alive(made_by_[node])) {
      if (!hooked.insert(fn.get()).second) continue;
      fn->add_pre_hook(std::make_unique<CallbackPreHook>(restore));
    }
  }
  for (const std::shared_ptr<Node>& fn : Alive(made_by_[producer])) {
    if (!hooked.insert(fn.get()).second) continue;
    fn->add_pre_hook(std::make_unique<CallbackPreHook>(restore));
  }
  // The copy back starts at the planned backward step (CUDA: on a side
  // stream, overlapping the steps until the first use waits for it).
  const int p = compiled_.swaps[i].prefetch_node;
  if (p < 0) return;
  if (SegmentRun* seg = replaying_segment(p)) {
    seg->AddReplayHook(p, prefetch);
    return;
  }
  for (const std::shared_ptr<Node>& fn : Alive(made_by_[p])) {
    if (hooked.count(fn.get()) != 0) continue;
    fn->add_pre_hook(std::make_unique<CallbackPreHook>(prefetch));
  }
}

void StepRun::TraceBackward() {
  // Memory before each backward node of the scheduled step, to compare
  // with the planner's timeline.
  DeviceBackend* backend = ctx_.backend;
  absl::flat_hash_set<Node*> traced;
  for (int id = 0; id < static_cast<int>(made_by_.size()); ++id) {
    for (const std::shared_ptr<Node>& fn : Alive(made_by_[id])) {
      if (!traced.insert(fn.get()).second) continue;
      const std::string name = fn->name();
      fn->add_pre_hook(std::make_unique<CallbackPreHook>([backend, name, id]() {
        // The step's peak so far: where it rises, the peak was reached
        // since the previous line (inside a replay, say).
        MUTWO_LOG(trace, "backward {} (node {}): {} B before (peak {} B)", name,
                  id, backend->AllocatedBytes(), backend->PeakBytes());
      }));
    }
  }
  MUTWO_LOG(trace, "loss: {} B (peak {} B)", backend->AllocatedBytes(),
            backend->PeakBytes());
  if (!tracing_) return;
  // What is resident now, by the forward node (or segment's first node)
  // that allocated it, to compare with the planner's residents.
  std::map<int64_t, int64_t> live;
  for (const LiveBlock& b : backend->LiveBlocks()) live[b.tag] += b.size_bytes;
  for (const auto& [tag, bytes] : live) {
    MUTWO_LOG(trace, "resident after the loss: {} B from node {}", bytes, tag);
  }
  backend->SetTag(kIdleTag);
}

}  // namespace mutwo::worker
