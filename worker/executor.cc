#include "worker/executor.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "worker/alias.h"
#include "worker/autograd_hooks.h"
#include "worker/checkpoint.h"
#include "worker/execution_plan.h"
#include "worker/graph.h"
#include "worker/inputs.h"
#include "worker/interpreter.h"
#include "worker/memory.h"
#include "worker/model_loader.h"
#include "worker/swap.h"
#include "worker/training_setup.h"

namespace mutwo::worker {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;
using torch::jit::Value;

// Deterministic cuDNN algorithms and deterministic kernels of the other ops
// that have them while in scope (the previous settings restored after).
class DeterministicKernels {
 public:
  DeterministicKernels()
      : previous_(at::globalContext().deterministicCuDNN()),
        previous_algorithms_(at::globalContext().deterministicAlgorithms()),
        previous_warn_only_(
            at::globalContext().deterministicAlgorithmsWarnOnly()),
        previous_tf32_cudnn_(at::globalContext().allowTF32CuDNN()),
        previous_tf32_cublas_(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setDeterministicCuDNN(true);
    // Also the deterministic kernels of the other ops that have them
    // (index_add, scatter_add, ...); warn_only: an op without one (upsample
    // backward on CUDA) runs as it is, and the comparison measures that
    // noise with a second plain step.
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    // And full fp32: TF32 (cuDNN's default for convolutions on Ampere and
    // later) rounds the operands to 10 mantissa bits, which turns autograd's
    // changed summation order under segments (a GoogLeNet inception input's
    // four branch gradients) into differences of 2.5e-5 of the step's
    // largest gradient on an H100, above the tolerance.
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  ~DeterministicKernels() {
    at::globalContext().setDeterministicCuDNN(previous_);
    at::globalContext().setDeterministicAlgorithms(previous_algorithms_,
                                                   previous_warn_only_);
    at::globalContext().setAllowTF32CuDNN(previous_tf32_cudnn_);
    at::globalContext().setAllowTF32CuBLAS(previous_tf32_cublas_);
  }
  DeterministicKernels(const DeterministicKernels&) = delete;
  DeterministicKernels& operator=(const DeterministicKernels&) = delete;

 private:
  bool previous_;
  bool previous_algorithms_;
  bool previous_warn_only_;
  bool previous_tf32_cudnn_;
  bool previous_tf32_cublas_;
};

// What one training step ran (the schedule's runtime state). Lives until
// the step's backward is over: autograd hooks point into it.
struct StepRun {
  std::vector<std::unique_ptr<SegmentRun>> segments;
  absl::flat_hash_map<int, int> segment_starting_at;   // node -> segment
  absl::flat_hash_map<int, std::vector<int>> tail_at;  // node -> segments
  // Autograd nodes made by each top-level node (a segment's range maps to
  // its function's node). Weak: the graph of an output the loss does not
  // read (GoogLeNet's auxiliary heads) is freed when the outputs are
  // dropped, before backward; hooks go on the nodes still alive.
  std::vector<std::vector<std::weak_ptr<Node>>> made_by;
  std::set<std::weak_ptr<Node>, std::owner_less<std::weak_ptr<Node>>> seen;
  std::vector<std::vector<std::unique_ptr<HostStash>>> stashes;  // per swap
  std::vector<bool> offloaded;
  std::vector<int> swap_free_after;         // per swap, observed at run time
  std::vector<std::set<int>> swap_readers;  // per swap
  int64_t swapped_bytes = 0;
  // Per node: the storages it read in this forward (identity only). The static
  // readers (alias.h) hold every reader of a container's entries for each entry
  // (a dict of feature maps makes the reader of one map a reader of all); a
  // replay or a restore waits only for the nodes that read the storage.
  absl::flat_hash_map<int, absl::flat_hash_set<const c10::StorageImpl*>> reads;

  // Whether node `reader`'s backward may need `storage`: it read it in
  // forward (or it did not run: it may read anything).
  bool MayRead(int reader, const c10::StorageImpl* storage) const {
    auto it = reads.find(reader);
    return it == reads.end() || it->second.count(storage) != 0;
  }
};

void Discover(StepRun& run, int first, int last,
              const std::vector<torch::Tensor>& tensors) {
  std::vector<std::weak_ptr<Node>> found;
  std::vector<std::shared_ptr<Node>> stack;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || t.grad_fn() == nullptr) continue;
    if (run.seen.insert(t.grad_fn()).second) stack.push_back(t.grad_fn());
  }
  while (!stack.empty()) {
    std::shared_ptr<Node> fn = std::move(stack.back());
    stack.pop_back();
    found.push_back(fn);
    for (const auto& edge : fn->next_edges()) {
      if (edge.function != nullptr && run.seen.insert(edge.function).second) {
        stack.push_back(edge.function);
      }
    }
  }
  for (int id = first; id <= last; ++id) {
    run.made_by[id].insert(run.made_by[id].end(), found.begin(), found.end());
  }
}

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

}  // namespace

struct Executor::State : TrainingState {
  ExecutorOptions options;
  // The schedule being run, compiled (execution_plan.h).
  ExecutionPlan compiled;
  // The caller's loss (UserStep); unset: the options' loss and target.
  std::function<torch::Tensor(const c10::IValue&)> user_loss;

  // One forward + loss + backward; `scheduled` applies the schedule.
  // Returns the loss.
  absl::StatusOr<torch::Tensor> Step(bool scheduled);
  absl::Status TimedSteps(bool scheduled, v1::StepStats* stats);
};

absl::StatusOr<torch::Tensor> Executor::State::Step(bool scheduled) {
  const int n = graph->num_nodes();
  auto run = std::make_unique<StepRun>();
  InterpreterHooks hooks;
  // `--log_level trace`: allocations are tagged with the forward node that
  // made them, and what is resident after the loss is listed by node.
  const bool tracing = scheduled && spdlog::should_log(spdlog::level::trace) &&
                       backend->SupportsTracking();
  if (scheduled) {
    run->made_by.assign(n, {});
    for (size_t s = 0; s < compiled.segments.size(); ++s) {
      run->segments.push_back(
          std::make_unique<SegmentRun>(&compiled.segments[s], graph.get(),
                                       interpreter.get(), &module, device));
      run->segment_starting_at[compiled.segments[s].first_node] =
          static_cast<int>(s);
      for (int k : compiled.segments[s].tail) {
        run->tail_at[k].push_back(static_cast<int>(s));
      }
    }
    run->stashes.resize(compiled.swaps.size());
    run->offloaded.assign(compiled.swaps.size(), false);
    run->swap_readers.resize(compiled.swaps.size());
    for (const SwapPlan& swap : compiled.swaps) {
      run->swap_free_after.push_back(swap.offload_after);
      run->swap_readers[run->swap_free_after.size() - 1].insert(
          swap.readers.begin(), swap.readers.end());
    }
    StepRun* r = run.get();
    // Swapped storages a replay reads come back first.
    for (size_t s = 0; s < run->segments.size(); ++s) {
      SegmentRun* seg = run->segments[s].get();
      // The parts of one planner segment (execution_plan.h: a group split
      // at an in-place write) replay together, where the planner replays
      // the whole: at its members' first need.
      std::vector<SegmentRun*> siblings;
      for (size_t o = 0; o < run->segments.size(); ++o) {
        if (o != s &&
            compiled.segments[o].segment == compiled.segments[s].segment) {
          siblings.push_back(run->segments[o].get());
        }
      }
      seg->set_before_replay([r, seg]() {
        absl::flat_hash_set<const c10::StorageImpl*> needed;
        std::vector<torch::Tensor> inputs = seg->saved_inputs();
        for (const torch::Tensor& t : seg->tail_tensors()) inputs.push_back(t);
        for (const torch::Tensor& t : inputs) {
          if (t.defined() && t.has_storage()) {
            needed.insert(t.storage().unsafeGetStorageImpl());
          }
        }
        for (auto& list : r->stashes) {
          for (auto& stash : list) {
            if (stash->offloaded() && needed.count(stash->storage()) > 0) {
              stash->Restore();
            }
          }
        }
      });
      // What it pinned in other segments can go once it replayed.
      seg->set_after_replay([r, seg, siblings]() {
        for (auto& other : r->segments) other->Unpin(seg);
        for (SegmentRun* sibling : siblings) sibling->Replay();
      });
    }
    auto offload = [this, r](size_t i, int last) {
      r->offloaded[i] = true;
      int64_t offloaded_bytes = 0;
      for (auto& stash : r->stashes[i]) {
        stash->Offload();
        if (stash->offloaded()) offloaded_bytes += stash->nbytes();
      }
      r->swapped_bytes += offloaded_bytes;
      MUTWO_LOG(trace,
                "swap value {}: offloaded after node {}: {} B of {} storages",
                compiled.swaps[i].value_id, last, offloaded_bytes,
                r->stashes[i].size());
    };
    auto after = [this, r, offload](int last) {
      for (auto& segment : r->segments) segment->FreeAfter(last);
      for (size_t i = 0; i < compiled.swaps.size(); ++i) {
        if (r->offloaded[i] || r->swap_free_after[i] > last) continue;
        offload(i, last);
      }
    };
    // A swap past the planner's offload point that waits only for the
    // static readers of containers it may sit in (which dict entry a node
    // reads is not known before it runs: torchvision's feature dicts) goes
    // as soon as no value the rest of the forward can read holds its
    // storages. The interpreter drops values after their last use, so what
    // `env` holds before node `id` is all that nodes from `id` on read.
    auto offload_unheld = [this, r, offload](int id,
                                             const InterpreterEnv& env) {
      std::vector<size_t> waiting;
      for (size_t i = 0; i < compiled.swaps.size(); ++i) {
        if (!r->offloaded[i] && !r->stashes[i].empty() &&
            compiled.swaps[i].planned_offload_after < id &&
            r->swap_free_after[i] >= id) {
          waiting.push_back(i);
        }
      }
      if (waiting.empty()) return;
      absl::flat_hash_set<const c10::StorageImpl*> held;
      for (const auto& [value, ivalue] : env) {
        for (const torch::Tensor& t : FlattenTensors(ivalue)) {
          if (t.defined() && t.has_storage()) {
            held.insert(t.storage().unsafeGetStorageImpl());
          }
        }
      }
      for (size_t i : waiting) {
        bool still_held = false;
        for (const auto& stash : r->stashes[i]) {
          still_held |= held.count(stash->storage()) > 0;
        }
        if (!still_held) offload(i, id - 1);
      }
    };
    auto register_swaps = [this, r](int first, int last,
                                    const InterpreterEnv& env) {
      for (size_t i = 0; i < compiled.swaps.size(); ++i) {
        const int p = compiled.swaps[i].producer;
        if (p < first || p > last) continue;
        std::vector<c10::IValue> values;
        for (const Value* out : compiled.swaps[i].values) {
          auto it = env.find(out);
          if (it != env.end()) values.push_back(it->second);
        }
        absl::flat_hash_set<const c10::StorageImpl*> seen;
        for (const torch::Tensor& t : TensorsOf(values)) {
          if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) {
            continue;
          }
          if (!seen.insert(t.storage().unsafeGetStorageImpl()).second) continue;
          r->stashes[i].push_back(MakeHostStash(t.storage(), device));
        }
      }
    };
    // Any later value sharing a storage the schedule frees keeps it alive
    // until its own last use; its readers need it back in backward.
    auto observe = [this, r](int first, int last,
                             const std::vector<torch::Tensor>& tensors) {
      int last_use = 0;
      std::set<int> consumers;
      for (int id = first; id <= last; ++id) {
        const IrNode& ir = graph->nodes()[id];
        last_use = std::max(last_use, ir.returns_output
                                          ? std::numeric_limits<int>::max()
                                          : ir.last_use);
        for (int c : ir.consumers) {
          if (c > last) consumers.insert(c);
        }
      }
      const std::vector<int> readers(consumers.begin(), consumers.end());
      for (size_t s = 0; s < r->segments.size(); ++s) {
        if (compiled.segments[s].last_node < first) {
          r->segments[s]->Observe(tensors, last_use, readers);
        }
      }
      for (size_t i = 0; i < compiled.swaps.size(); ++i) {
        if (r->offloaded[i] || r->stashes[i].empty()) continue;
        for (const torch::Tensor& t : tensors) {
          if (!t.defined() || !t.has_storage()) continue;
          for (const auto& stash : r->stashes[i]) {
            if (stash->storage() != t.storage().unsafeGetStorageImpl())
              continue;
            r->swap_free_after[i] = std::max(r->swap_free_after[i], last_use);
            r->swap_readers[i].insert(readers.begin(), readers.end());
          }
        }
      }
    };
    // What each node reads in forward (top-level nodes here, a segment's
    // nodes in its forward run).
    auto record_reads = [this, r](int id, const InterpreterEnv& env) {
      absl::flat_hash_set<const c10::StorageImpl*>& read = r->reads[id];
      ForEachRead(graph->nodes()[id].node, [&](const Value* v) {
        auto it = env.find(v);
        if (it == env.end()) return;
        for (const torch::Tensor& t : FlattenTensors(it->second)) {
          if (t.defined() && t.has_storage()) {
            read.insert(t.storage().unsafeGetStorageImpl());
          }
        }
      });
    };
    for (auto& segment : r->segments) segment->set_read_observer(record_reads);
    hooks.take_over = [this, r, after, register_swaps, observe, tracing,
                       record_reads,
                       offload_unheld](int id, InterpreterEnv& env) -> int {
      offload_unheld(id, env);
      if (r->segment_starting_at.count(id) == 0) record_reads(id, env);
      // Tail nodes of earlier segments: what they read is kept (and stays
      // resident) until that segment's replay.
      if (auto tail = r->tail_at.find(id); tail != r->tail_at.end()) {
        for (int s : tail->second) {
          SegmentRun* owner = r->segments[s].get();
          owner->CaptureTail(id, env);
          const std::vector<torch::Tensor> captured = owner->tail_tensors();
          for (auto& other : r->segments) other->Pin(captured, owner);
        }
      }
      auto it = r->segment_starting_at.find(id);
      if (it == r->segment_starting_at.end()) return -1;
      SegmentRun* seg = r->segments[it->second].get();
      const SegmentPlan& plan = compiled.segments[it->second];
      current_step =
          absl::StrCat("recompute segment ", plan.segment, " (nodes ",
                       plan.first_node, "..", plan.last_node, ")");
      {
        std::vector<c10::IValue> inputs;
        for (const Value* v : plan.inputs) inputs.push_back(env.at(v));
        const std::vector<torch::Tensor> tensors = TensorsOf(inputs);
        for (auto& earlier : r->segments) earlier->Pin(tensors, seg);
      }
      if (tracing) backend->SetTag(plan.first_node);
      seg->Forward(env);
      std::vector<c10::IValue> outputs;
      for (const Value* v : plan.outputs) outputs.push_back(env.at(v));
      const std::vector<torch::Tensor> tensors = TensorsOf(outputs);
      Discover(*r, plan.first_node, plan.last_node, tensors);
      register_swaps(plan.first_node, plan.last_node, env);
      observe(plan.first_node, plan.last_node, tensors);
      after(plan.last_node);
      MUTWO_LOG(trace, "forward node {}: {} B after (segment {}; peak {} B)",
                plan.last_node, backend->AllocatedBytes(), plan.segment,
                backend->PeakBytes());
      return plan.last_node;
    };
    hooks.before_node = [this, tracing](int id) {
      current_step = absl::StrCat("forward node ", graph->Describe(id));
      if (tracing) backend->SetTag(id);
    };
    hooks.after_node = [this, r, after, register_swaps, observe](
                           int id, std::vector<c10::IValue>& outputs) {
      const std::vector<torch::Tensor> tensors = TensorsOf(outputs);
      Discover(*r, id, id, tensors);
      InterpreterEnv env;
      const auto& values = graph->nodes()[id].node->outputs();
      for (size_t i = 0; i < values.size() && i < outputs.size(); ++i) {
        env[values[i]] = outputs[i];
      }
      register_swaps(id, id, env);
      observe(id, id, tensors);
      after(id);
      MUTWO_LOG(trace, "forward node {}: {} B after (peak {} B)", id,
                backend->AllocatedBytes(), backend->PeakBytes());
    };
  }

  current_step = "forward";
  absl::StatusOr<c10::IValue> outputs = interpreter->Run(module, inputs, hooks);
  if (!outputs.ok()) {
    if (absl::IsResourceExhausted(outputs.status())) {
      return absl::ResourceExhaustedError(
          absl::StrCat(current_step, ": ", outputs.status().message()));
    }
    return outputs.status();
  }
  torch::Tensor loss;
  current_step = "loss";
  MUTWO_RETURN_IF_ERROR(Guard(current_step, [&]() {
    if (user_loss) {
      loss = user_loss(*outputs);
    } else {
      MUTWO_ASSIGN_OR_RETURN(loss, ComputeLoss(options.loss, *outputs, target));
    }
    if (!loss.requires_grad()) {
      return absl::InvalidArgumentError(
          "the loss does not depend on any trainable parameter");
    }
    return absl::OkStatus();
  }));
  outputs = c10::IValue();

  if (scheduled) {
    StepRun* r = run.get();
    for (size_t s = 0; s < compiled.segments.size(); ++s) {
      SegmentRun* seg = r->segments[s].get();
      for (int reader :
           seg->readers([r](int reader, const c10::StorageImpl*storage) {
             return r->MayRead(reader, storage);
           })) {
        // A reader inside another segment's range runs in that segment's
        // replay: the hook goes on the replay's nodes it makes, so this
        // segment replays where that backward reaches the reader (the
        // planner's position), not before the whole of it.
        const int inside = compiled.SegmentHolding(reader);
        // (`--log_level trace`: the memory around each replay.)
        const int id = compiled.segments[s].segment;
        auto replay = [this, seg, id, reader]() {
          if (seg->replayed()) return;
          MUTWO_LOG(trace, "replay segment {} for node {}: {} B before", id,
                    reader, backend->AllocatedBytes());
          seg->Replay();
          MUTWO_LOG(trace, "replay segment {}: {} B after (peak {} B)", id,
                    backend->AllocatedBytes(), backend->PeakBytes());
        };
        if (inside >= 0 && inside != static_cast<int>(s)) {
          r->segments[inside]->AddReplayHook(reader, replay);
          continue;
        }
        for (const std::shared_ptr<Node>& fn : Alive(r->made_by[reader])) {
          fn->add_pre_hook(std::make_unique<CallbackPreHook>(replay));
        }
      }
    }
    for (size_t i = 0; i < compiled.swaps.size(); ++i) {
      std::vector<int> nodes;
      for (int reader : r->swap_readers[i]) {
        for (const auto& stash : r->stashes[i]) {
          if (r->MayRead(reader, stash->storage())) {
            nodes.push_back(reader);
            break;
          }
        }
      }
      const int producer = compiled.swaps[i].producer;
      // A node inside a recompute segment's range (not the producer's own
      // segment) gets the hook on the nodes its replay makes: the segment's
      // function runs the backward of its whole range, so a hook on it
      // would copy back when that starts, not at the node's step (a
      // ResNet-152 prefetch planned at a block's first convolution came
      // back at its last one: +12% at the floor on the H100).
      const int producer_segment = compiled.SegmentHolding(producer);
      auto replaying_segment = [&](int node) -> SegmentRun* {
        const int o = compiled.SegmentHolding(node);
        return o >= 0 && o != producer_segment ? r->segments[o].get() : nullptr;
      };
      auto restore = [r, i]() {
        for (auto& stash : r->stashes[i]) stash->Restore();
      };
      auto prefetch = [r, i]() {
        for (auto& stash : r->stashes[i]) stash->Prefetch();
      };
      absl::flat_hash_set<Node*> hooked;
      for (int node : nodes) {
        if (SegmentRun* seg = replaying_segment(node)) {
          seg->AddReplayHook(node, restore);
          continue;
        }
        for (const std::shared_ptr<Node>& fn : Alive(r->made_by[node])) {
          if (!hooked.insert(fn.get()).second) continue;
          fn->add_pre_hook(std::make_unique<CallbackPreHook>(restore));
        }
      }
      for (const std::shared_ptr<Node>& fn : Alive(r->made_by[producer])) {
        if (!hooked.insert(fn.get()).second) continue;
        fn->add_pre_hook(std::make_unique<CallbackPreHook>(restore));
      }
      // The copy back starts at the planned backward step (CUDA: on a side
      // stream, overlapping the steps until the first use waits for it).
      const int p = compiled.swaps[i].prefetch_node;
      if (p >= 0) {
        if (SegmentRun* seg = replaying_segment(p)) {
          seg->AddReplayHook(p, prefetch);
        } else {
          for (const std::shared_ptr<Node>& fn : Alive(r->made_by[p])) {
            if (hooked.count(fn.get()) != 0) continue;
            fn->add_pre_hook(std::make_unique<CallbackPreHook>(prefetch));
          }
        }
      }
    }
  }
  if (scheduled && spdlog::should_log(spdlog::level::trace)) {
    // `--log_level trace`: memory before each backward node of the
    // scheduled step, to compare with the planner's timeline.
    absl::flat_hash_set<Node*> traced;
    for (int id = 0; id < n; ++id) {
      for (const std::shared_ptr<Node>& fn : Alive(run->made_by[id])) {
        if (!traced.insert(fn.get()).second) continue;
        const std::string name = fn->name();
        fn->add_pre_hook(std::make_unique<CallbackPreHook>([this, name, id]() {
          // The step's peak so far: where it rises, the peak was reached
          // since the previous line (inside a replay, say).
          MUTWO_LOG(trace, "backward {} (node {}): {} B before (peak {} B)",
                    name, id, backend->AllocatedBytes(), backend->PeakBytes());
        }));
      }
    }
    MUTWO_LOG(trace, "loss: {} B (peak {} B)", backend->AllocatedBytes(),
              backend->PeakBytes());
    if (tracing) {
      // What is resident now, by the forward node (or segment's first
      // node) that allocated it, to compare with the planner's residents.
      std::map<int64_t, int64_t> live;
      for (const LiveBlock& b : backend->LiveBlocks()) {
        live[b.tag] += b.size_bytes;
      }
      for (const auto& [tag, bytes] : live) {
        MUTWO_LOG(trace, "resident after the loss: {} B from node {}", bytes,
                  tag);
      }
      backend->SetTag(kIdleTag);
    }
  }
  current_step = "backward";
  MUTWO_RETURN_IF_ERROR(Guard(current_step, [&]() {
    loss.backward();
    return absl::OkStatus();
  }));
  return loss.detach();
}

absl::Status Executor::State::TimedSteps(bool scheduled, v1::StepStats* stats) {
  double ms = 0;
  int64_t peak = 0;
  MUTWO_RETURN_IF_ERROR(TrainingState::TimedSteps(
      options.warmup_iterations, options.measure_iterations,
      [&]() { return Step(scheduled).status(); }, &ms, &peak));
  stats->set_peak_bytes(peak);
  stats->set_iteration_ms(ms);
  return absl::OkStatus();
}

namespace {

// The schedule was planned from a profile of this graph. On a mismatch the
// IR goes to the debug log, so that two builds of one file that disagree
// can be compared.
absl::Status CheckFingerprint(const v1::Schedule& schedule, const Graph& graph,
                              const std::string& model_name) {
  if (schedule.graph_fingerprint() == graph.fingerprint()) {
    return absl::OkStatus();
  }
  MUTWO_LOG(debug, "IR of {} (fingerprint {}):\n{}", model_name,
            graph.fingerprint(), graph.graph()->toString());
  return absl::InvalidArgumentError(absl::StrCat(
      "the schedule is for graph fingerprint \"", schedule.graph_fingerprint(),
      "\" but model ", model_name, " has graph fingerprint \"",
      graph.fingerprint(), "\" (", graph.num_nodes(),
      " IR nodes; plan it from a profile of this model)"));
}

}  // namespace

Executor::Executor(std::unique_ptr<State> state) : state_(std::move(state)) {}
Executor::~Executor() = default;

const std::string& Executor::graph_fingerprint() const {
  return state_->graph->fingerprint();
}
int Executor::num_nodes() const { return state_->graph->num_nodes(); }

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(
    ExecutorOptions options, const torch::jit::Module* module) {
  auto state = std::make_unique<State>();
  MUTWO_RETURN_IF_ERROR(SetUpTraining(options, state.get(), module));
  state->options = std::move(options);
  return std::unique_ptr<Executor>(new Executor(std::move(state)));
}

absl::StatusOr<v1::Validation> Executor::Run(const v1::Schedule& schedule) {
  State& s = *state_;
  const ExecutorOptions& o = s.options;
  MUTWO_RETURN_IF_ERROR(CheckFingerprint(schedule, *s.graph, o.model_name));
  if (schedule.batch_size() != o.batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the schedule is for batch size ", schedule.batch_size(),
                     ", the executor runs batch size ", o.batch_size));
  }
  MUTWO_ASSIGN_OR_RETURN(s.compiled, CompileSchedule(*s.graph, schedule));

  v1::Validation validation;
  validation.set_graph_fingerprint(s.graph->fingerprint());
  validation.set_batch_size(o.batch_size);
  validation.mutable_predicted()->set_peak_bytes(
      schedule.predicted_peak_bytes());
  validation.mutable_predicted()->set_iteration_ms(
      schedule.predicted_iteration_ms());
  validation.set_budget_bytes(schedule.budget_bytes());
  int recomputed = 0, swapped = 0;
  for (const v1::Decision& d : schedule.decisions()) {
    recomputed += d.action() == v1::Decision::RECOMPUTE;
    swapped += d.action() == v1::Decision::SWAP;
  }
  validation.set_recomputed(recomputed);
  validation.set_swapped(swapped);

  auto result = [&]() -> absl::Status {
    s.backend->SetTag(kIdleTag);
    *validation.mutable_device() = s.backend->Describe();
    s.current_step = "generating inputs";
    MUTWO_RETURN_IF_ERROR(Guard(s.current_step, [&]() -> absl::Status {
      MUTWO_ASSIGN_OR_RETURN(
          std::vector<torch::Tensor> inputs,
          MakeInputs(o.inputs, o.batch_size, s.device, o.seed));
      MUTWO_ASSIGN_OR_RETURN(s.target,
                             MakeTarget(o.loss, o.batch_size, s.device));
      s.inputs.assign(inputs.begin(), inputs.end());
      MUTWO_ASSIGN_OR_RETURN(s.optimizer,
                             MakeOptimizer(o.optimizer, s.parameters));
      return absl::OkStatus();
    }));

    // Correctness: the same state and seed, one step each, no optimizer.
    std::vector<torch::Tensor> params, buffers, param_copies, buffer_copies;
    for (const torch::Tensor& p : s.module.parameters()) params.push_back(p);
    for (const torch::Tensor& b : s.module.buffers()) buffers.push_back(b);
    if (o.run_baseline) {
      torch::NoGradGuard no_grad;
      for (const torch::Tensor& p : params) param_copies.push_back(p.clone());
      for (const torch::Tensor& b : buffers) buffer_copies.push_back(b.clone());
    }
    auto restore = [&]() {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i)
        params[i].copy_(param_copies[i]);
      for (size_t i = 0; i < buffers.size(); ++i) {
        buffers[i].copy_(buffer_copies[i]);
      }
    };
    struct Outcome {
      double loss = 0;
      std::vector<torch::Tensor> grads, buffers;
    };
    auto one_step = [&](bool scheduled, Outcome* out) -> absl::Status {
      restore();
      s.ZeroGrads();
      torch::manual_seed(o.seed + 1);
      MUTWO_ASSIGN_OR_RETURN(torch::Tensor loss, s.Step(scheduled));
      return Guard("comparing", [&]() {
        out->loss = loss.item<double>();
        for (size_t i = 0; i < s.parameters.size(); ++i) {
          const torch::Tensor& p = s.parameters[i];
          const torch::Tensor& g = p.grad();
          // A gradient whose memory a schedule's hook released would read
          // freed memory (on CUDA an illegal address, reported much later).
          if (g.defined() && g.numel() > 0 &&
              (!g.has_storage() || g.storage().data() == nullptr)) {
            return absl::InternalError(absl::StrCat(
                "the ", scheduled ? "scheduled" : "unmodified",
                " step left the gradient of parameter ", s.parameter_names[i],
                " without memory (released while still the parameter's "
                ".grad)"));
          }
          out->grads.push_back(p.grad().defined()
                                   ? p.grad().to(torch::kFloat64)
                                   : torch::zeros_like(p, torch::kFloat64));
        }
        for (const torch::Tensor& b : buffers) {
          out->buffers.push_back(b.to(torch::kFloat64));
        }
        return absl::OkStatus();
      });
    };
    double max_diff = 0;
    bool match = o.run_baseline, buffers_match = o.run_baseline;
    if (!o.run_baseline) {
      // Only the scheduled step (the unmodified one may not fit).
      validation.set_baseline_skipped(true);
    } else {
      Outcome base, sched, again;
      {
        // cuDNN's default algorithms are not deterministic (two plain steps
        // of a ResNet-50 differ by 0.03 of 26.7 on an H200): the comparison
        // steps use deterministic ones, so a difference is the schedule's.
        // The timed steps below keep the default.
        DeterministicKernels deterministic;
        MUTWO_RETURN_IF_ERROR(one_step(false, &base));
        // On a GPU some ops have no deterministic kernel (atomic adds in
        // upsample and pooling backward): a second plain step measures how
        // far two unmodified steps differ, and a schedule may differ that
        // much too. The CPU's kernels are deterministic.
        if (s.device.is_cuda()) {
          MUTWO_RETURN_IF_ERROR(one_step(false, &again));
        }
        MUTWO_RETURN_IF_ERROR(one_step(true, &sched));
      }
      restore();
      s.ZeroGrads();
      double worst_excess = 0;
      double scale = 0;  // the largest gradient element of the step
      for (const torch::Tensor& g : base.grads) {
        if (g.numel() > 0)
          scale = std::max(scale, g.abs().max().item<double>());
      }
      for (size_t i = 0; i < base.grads.size(); ++i) {
        const torch::Tensor diff = (sched.grads[i] - base.grads[i]).abs();
        if (diff.numel() == 0) continue;
        const double worst = diff.max().item<double>();
        max_diff = std::max(max_diff, worst);
        const double noise =
            again.grads.empty()
                ? 0.0
                : (again.grads[i] - base.grads[i]).abs().max().item<double>();
        const double excess =
            worst - (o.grad_atol + o.grad_rtol * scale + 2 * noise);
        if (excess > 0) {
          match = false;
          if (excess > worst_excess) {
            worst_excess = excess;
            validation.set_worst_gradient_parameter(s.parameter_names[i]);
          }
          MUTWO_LOG(warn,
                    "gradient of parameter {} differs by up to {} (largest "
                    "gradient element of the step: {}; two plain steps "
                    "differ by {})",
                    s.parameter_names[i], worst, scale, noise);
        }
      }
      for (size_t i = 0; i < base.buffers.size(); ++i) {
        if (base.buffers[i].numel() == 0) continue;
        // Equal elements (infinities too: a causal mask buffer holds -inf,
        // and -inf - -inf is NaN) differ by nothing; the scale is that of
        // the finite ones.
        const torch::Tensor& a = sched.buffers[i];
        const torch::Tensor& b = base.buffers[i];
        const torch::Tensor same =
            a.eq(b).logical_or(a.isnan().logical_and(b.isnan()));
        const torch::Tensor diff = (a - b).abs().masked_fill(same, 0);
        const double scale = b.masked_fill(b.isfinite().logical_not(), 0)
                                 .abs()
                                 .max()
                                 .item<double>();
        buffers_match &=
            diff.max().item<double>() <= o.grad_atol + o.grad_rtol * scale;
      }
      validation.set_loss_diff(std::abs(sched.loss - base.loss));
    }
    // The copies are gone before the timed steps (they would count).
    param_copies.clear();
    buffer_copies.clear();
    validation.set_gradients_match(match);
    validation.set_max_abs_grad_diff(max_diff);
    validation.set_batchnorm_stats_match(buffers_match);

    if (o.run_baseline) {
      MUTWO_RETURN_IF_ERROR(s.TimedSteps(false, validation.mutable_baseline()));
    }
    MUTWO_RETURN_IF_ERROR(s.TimedSteps(true, validation.mutable_scheduled()));
    return absl::OkStatus();
  }();
  s.ZeroGrads();
  s.optimizer.reset();
  if (absl::IsResourceExhausted(result)) {
    validation.set_oom(true);
    validation.set_error(std::string(result.message()));
    return validation;
  }
  if (!result.ok()) {
    return absl::Status(result.code(), absl::StrCat("model ", o.model_name,
                                                    ": ", result.message()));
  }
  validation.set_within_budget(schedule.budget_bytes() <= 0 ||
                               validation.scheduled().peak_bytes() <=
                                   schedule.budget_bytes());
  return validation;
}

absl::Status Executor::PrepareUserStep(const v1::Schedule& schedule) {
  State& s = *state_;
  MUTWO_RETURN_IF_ERROR(
      CheckFingerprint(schedule, *s.graph, s.options.model_name));
  MUTWO_ASSIGN_OR_RETURN(s.compiled, CompileSchedule(*s.graph, schedule));
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> Executor::UserStep(
    std::vector<c10::IValue> inputs,
    const std::function<torch::Tensor(const c10::IValue&)>& loss) {
  State& s = *state_;
  s.inputs = std::move(inputs);
  s.user_loss = loss;
  absl::StatusOr<torch::Tensor> out = s.Step(/*scheduled=*/true);
  s.user_loss = nullptr;
  s.inputs.clear();  // the caller's tensors are not held between steps
  return out;
}

}  // namespace mutwo::worker
