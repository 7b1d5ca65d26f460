// StepRun: the runtime state of one scheduled training step and the phases
// that apply the compiled schedule (execution_plan.h) to it:
//   1. construction: a SegmentRun per recompute segment, the swaps'
//      bookkeeping, and what a replay restores first and releases after;
//   2. ForwardHooks(): the interpreter's hooks for the forward, which run
//      segments under no_grad, stash swapped storages and offload them once
//      nothing the rest of the forward reads holds them;
//   3. HookBackward(), after the loss: autograd pre-hooks that replay each
//      segment and copy each swap back where the backward first needs it;
//   4. TraceBackward() (`--log_level trace`): memory before each backward
//      node and what is resident after the loss.
//
// Owned by the executor's Step for the whole step: the interpreter's and
// autograd's hooks point into it, so it must outlive the backward. The
// context's objects must outlive it. Not thread-safe (one step at a time).
// Errors surface from the interpreter and autograd, which run the hooks.
#ifndef MUTWO_WORKER_STEP_RUN_H_
#define MUTWO_WORKER_STEP_RUN_H_

#include <torch/script.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "worker/checkpoint.h"
#include "worker/execution_plan.h"
#include "worker/graph.h"
#include "worker/interpreter.h"
#include "worker/memory.h"
#include "worker/swap.h"

namespace mutwo::worker {

// What a step runs on: the executor's objects, borrowed.
struct StepContext {
  const ExecutionPlan* compiled = nullptr;
  const Graph* graph = nullptr;
  Interpreter* interpreter = nullptr;
  torch::jit::Module* module = nullptr;
  torch::Device device{torch::kCPU};
  DeviceBackend* backend = nullptr;
  // What the step is doing, for error messages.
  std::string* current_step = nullptr;
};

class StepRun {
 public:
  // `tracing`: tag allocations with the forward node that made them.
  StepRun(const StepContext& context, bool tracing);
  StepRun(const StepRun&) = delete;
  StepRun& operator=(const StepRun&) = delete;

  // Hooks for Interpreter::Run; they point into this StepRun. None for a
  // schedule with no segment and no swap (unless tracing): that step is the
  // unscheduled one and pays nothing per node.
  InterpreterHooks ForwardHooks();
  // After the loss, before backward: replay and restore hooks.
  void HookBackward();
  // After HookBackward, when tracing is on at any level: memory logs.
  void TraceBackward();

 private:
  using Storages = absl::flat_hash_set<const c10::StorageImpl*>;

  // Phase 1: the replays' neighbours (swaps restored before, siblings
  // replayed and pins released after).
  void WireReplays();

  // Forward, for a top-level node or a whole segment `first`..`last`.
  int TakeOver(int id, InterpreterEnv& env);
  void BeforeNode(int id);
  void AfterNode(int id, std::vector<c10::IValue>& outputs);
  void Offload(size_t swap, int last);
  // Segments' frees and the swaps due after node `last`.
  void FreeAfter(int last);
  // Swaps past their planned offload point that nothing in `env` holds.
  void OffloadUnheld(int id, const InterpreterEnv& env);
  // Stashes for the swaps whose producer is in `first`..`last`; `find`
  // gives a value's IValue (nullptr: not held).
  void RegisterSwaps(
      int first, int last,
      const std::function<const c10::IValue*(const torch::jit::Value*)>& find);
  // Whether a storage of `tensors` is one Observe may match (a segment's
  // output or a swap's stash): most nodes' outputs are not.
  bool Watched(const std::vector<torch::Tensor>& tensors) const;
  // Later values sharing a storage the schedule frees keep it alive.
  void Observe(int first, int last, const std::vector<torch::Tensor>& tensors);
  void RecordReads(int id, const InterpreterEnv& env);
  // Node `id` of segment `s` reads, in its forward run, storages that
  // earlier segments' outputs hold: those segments' readers.
  void RecordSegmentReads(size_t s, int id, const InterpreterEnv& env);
  // Autograd nodes made by `first`..`last`, from their output tensors.
  void Discover(int first, int last, const std::vector<torch::Tensor>& tensors);

  // Backward: hooks for one segment's replay and one swap's copy back.
  void HookReplay(size_t s);
  void HookSwap(size_t i);

  // Whether node `reader`'s backward may need `storage`: it read it in
  // forward (or it did not run: it may read anything).
  bool MayRead(int reader, const c10::StorageImpl* storage) const;

  StepContext ctx_;
  const ExecutionPlan& compiled_;
  const bool tracing_;
  std::vector<std::unique_ptr<SegmentRun>> segments_;
  absl::flat_hash_map<int, int> segment_starting_at_;   // node -> segment
  absl::flat_hash_map<int, std::vector<int>> tail_at_;  // node -> segments
  // Autograd nodes made by each top-level node (a segment's range maps to
  // its function's node). Weak: the graph of an output the loss does not
  // read (GoogLeNet's auxiliary heads) is freed when the outputs are
  // dropped, before backward; hooks go on the nodes still alive.
  std::vector<std::vector<std::weak_ptr<torch::autograd::Node>>> made_by_;
  // Autograd nodes Discover attributed, by address; the weak pointer tells
  // a node that died (an output nothing differentiable read) from a new one
  // at its address.
  absl::flat_hash_map<const torch::autograd::Node*,
                      std::weak_ptr<torch::autograd::Node>>
      seen_;
  // Per node: whether the backward hooks may ask MayRead about it (a static
  // reader of a segment's output or of a swap, or a consumer Observe found):
  // only those record their reads.
  std::vector<bool> reader_;
  // Swaps by producer node.
  absl::flat_hash_map<int, std::vector<size_t>> swaps_of_producer_;
  // Storages Observe may match: segments' outputs and swaps' stashes
  // (identity only; entries stay after a free, which costs one Observe).
  Storages watched_;
  // The segments' outputs among them (a swap's stash is not one).
  Storages segment_outputs_;
  // The running segment's inputs that are earlier segments' outputs (what
  // RecordSegmentReads looks for; empty: nothing to look for).
  Storages inputs_from_segments_;
  std::vector<std::vector<std::unique_ptr<HostStash>>> stashes_;  // per swap
  std::vector<bool> offloaded_;
  std::vector<int> swap_free_after_;         // per swap, observed at run time
  std::vector<std::set<int>> swap_readers_;  // per swap
  int64_t swapped_bytes_ = 0;
  // Per node: the storages it read in this forward (identity only). The
  // static readers (alias.h) hold every reader of a container's entries for
  // each entry (a dict of feature maps makes the reader of one map a reader
  // of all); a replay or a restore waits only for the nodes that read the
  // storage.
  absl::flat_hash_map<int, Storages> reads_;
};

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_STEP_RUN_H_
