// RECOMPUTE: the schedule's recompute segments run inside a custom autograd
// function that keeps only the segment's inputs and replays the segment
// before its activations are needed in backward. What a segment covers (its
// node range, inputs, outputs, tail) is compiled once per schedule
// (execution_plan.h, SegmentPlan); this class runs it, once per step
// (checkpoint.cc: the forward run and what it frees; segment_replay.cc: the
// replay and the backward). The memory of the gradients its backward
// receives is gradient_memory.h's.
//
// Forward: the range runs under NoGradGuard (nothing inside is saved); its
// tensor inputs (values defined before the range and read in it, graph
// inputs, parameters read by GetAttr inside the range) are kept; its outputs
// (values used after the range) are returned. Output storages of member
// nodes are freed after their last forward use (Free()) and given back by
// the replay (Replay()), which the executor triggers from a pre-hook on the
// first backward node that reads them (or on the function's own node). The
// replay runs the range again with autograd on, from detached copies of the
// inputs, with the RNG state of the forward run (dropout draws the same
// mask) and with the module's buffers (batch-norm running statistics) put
// back afterwards, so they are updated once per step; the function's
// backward then backpropagates through the replay (autograd::grad with
// respect to the inputs and the parameters).
//
// Internal to the worker (includes LibTorch). Not thread-safe.
#ifndef MUTWO_WORKER_CHECKPOINT_H_
#define MUTWO_WORKER_CHECKPOINT_H_

#include <torch/script.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "worker/execution_plan.h"
#include "worker/graph.h"
#include "worker/interpreter.h"

namespace mutwo::worker {

// One training step's run of one segment. Owned by the executor for the
// whole step (forward to the end of backward).
class SegmentRun {
 public:
  SegmentRun(const SegmentPlan* plan, const Graph* graph,
             Interpreter* interpreter, const torch::jit::Module* module,
             const torch::Device& device);
  ~SegmentRun();

  // Runs the range through the autograd function on `env` (reads the
  // inputs, writes the outputs). Throws LibTorch errors.
  void Forward(InterpreterEnv& env);
  // The function's autograd node (nullptr when nothing required grad).
  const std::shared_ptr<torch::autograd::Node>& grad_fn() const {
    return grad_fn_;
  }
  // Frees the device memory of the freeable outputs whose last forward use
  // is at or before `node_id` (their storages stay, empty, until Replay()).
  void FreeAfter(int node_id);
  // Runtime aliasing: `tensors` (outputs of a node that ran after the
  // segment) that share a freeable storage keep it until `last_use`, and
  // `consumers` (the nodes reading them) need the replay in backward.
  void Observe(const std::vector<torch::Tensor>& tensors, int last_use,
               const std::vector<int>& consumers);
  // Node `reader` of a later segment read `storage` in forward, possibly
  // through an alias made inside that segment (a dropout of probability 0
  // returns its input), which Observe, fed the top-level nodes' outputs,
  // never sees: if it is one of this segment's output storages, the
  // reader's backward needs it back.
  void AddReader(const c10::StorageImpl* storage, int reader);
  // Storages of `tensors` (inputs of segment `by`, or values its tail
  // captured) are not freed while `by` has not replayed: it reads them then.
  void Pin(const std::vector<torch::Tensor>& tensors, const SegmentRun* by);
  // `by` replayed: storages only it pinned are freed now (after their last
  // forward use, unless this segment already replayed); readers of them
  // replay this segment, as for any freed storage.
  void Unpin(const SegmentRun* by);
  // Captures what tail node `node_id` reads from `env` (call before it runs
  // in forward).
  void CaptureTail(int node_id, const InterpreterEnv& env);
  // Tensors the tail captured (kept until the replay).
  std::vector<torch::Tensor> tail_tensors() const;
  // Top-level nodes whose backward needs the replay: the readers of the
  // storages FreeAfter freed or that stay pinned (freed once the pinning
  // segment replayed), where `may_read(node, storage)` (what the forward
  // observed); call after the forward.
  std::set<int> readers(
      const std::function<bool(int, const c10::StorageImpl*)>& may_read) const;
  // Identities of the output tensors' storages (after Forward).
  const std::vector<const c10::StorageImpl*>& output_storages() const {
    return tensor_impl_;
  }
  // Bytes freed by FreeAfter and not yet given back.
  int64_t freed_bytes() const { return freed_bytes_; }
  // Replays the range (once) and gives the freed storages their memory back.
  void Replay();
  bool replayed() const { return replayed_; }
  // Tensor inputs kept for the replay (their storages must be resident).
  const std::vector<torch::Tensor>& saved_inputs() const {
    return saved_inputs_;
  }
  // Called before Replay() reads the inputs (the executor restores swapped
  // storages there).
  void set_before_replay(std::function<void()> fn) {
    before_replay_ = std::move(fn);
  }
  // Called at the end of Replay() (the executor unpins this segment's
  // inputs in the earlier segments there).
  void set_after_replay(std::function<void()> fn) {
    after_replay_ = std::move(fn);
  }
  // Called in forward before each node of the range runs, with what it
  // reads (the executor records the storages each node read).
  void set_read_observer(
      std::function<void(int node_id, const InterpreterEnv& env)> fn) {
    read_observer_ = std::move(fn);
  }
  // `fn` runs before the backward of the autograd nodes that the replay
  // creates for node `node_id` of the range (a node reading another
  // segment's freed output: that segment replays there, in the middle of
  // this one's backward, where the planner puts it, rather than before the
  // whole of it). Call before the replay.
  void AddReplayHook(int node_id, std::function<void()> fn) {
    replay_hooks_[node_id].push_back(std::move(fn));
  }

  // Used by the autograd function.
  torch::autograd::variable_list RunForward(
      torch::autograd::AutogradContext* ctx, at::TensorList inputs);
  torch::autograd::variable_list Backward(
      const torch::autograd::variable_list& grad_outputs);

 private:
  // Forward()'s phases, in order (checkpoint.cc says what each does).
  std::vector<torch::Tensor> CaptureInputs(const InterpreterEnv& env);
  void CollectAttributeTensors();
  void WriteOutputs(const std::vector<torch::Tensor>& tensors,
                    const torch::autograd::variable_list& outputs,
                    InterpreterEnv& env);
  void TrackOutputStorages(const std::vector<torch::Tensor>& tensors,
                           const torch::autograd::variable_list& outputs);
  // Replay()'s phases, in order (segment_replay.cc says what each does).
  void CheckInputsResident() const;
  std::vector<c10::IValue> CopyBuffersForReplay();
  std::vector<torch::Tensor> RunReplay(
      std::vector<std::pair<torch::Tensor, torch::Tensor>>* buffer_feeds);
  void RunTail(InterpreterEnv& env);
  void RestoreBuffers(
      const std::vector<c10::IValue>& originals,
      const std::vector<std::pair<torch::Tensor, torch::Tensor>>& buffer_feeds);
  void GiveOutputsReplayMemory(
      const std::vector<torch::Tensor>& replay_outputs);
  // Replay(): runs the range node by node and hooks the autograd nodes each
  // node made (replay_hooks_).
  void RunRangeWithHooks(InterpreterEnv& env);
  c10::IValue Rebuild(const c10::IValue& shape,
                      const std::vector<torch::Tensor>& tensors,
                      size_t* next) const;
  // `shape` with each tensor replaced by the next `next_tensor()` returns.
  c10::IValue RebuildWith(
      const c10::IValue& shape,
      const std::function<torch::Tensor()>& next_tensor) const;
  // Tensors of container output `value` (RunForward's or the replay's env)
  // that the range added, in order; `layout` (per tensor of the container:
  // the input tensor it is, or -1) is filled by RunForward and read by the
  // replay.
  std::vector<torch::Tensor> AddedTensors(const c10::IValue& value,
                                          const std::vector<torch::Tensor>& in,
                                          std::vector<int>* layout,
                                          bool fill) const;

  const SegmentPlan* plan_;
  const Graph* graph_;
  Interpreter* interpreter_;
  const torch::jit::Module* module_;
  torch::Device device_;
  std::function<void()> before_replay_;
  std::function<void()> after_replay_;
  std::function<void(int, const InterpreterEnv&)> read_observer_;
  absl::flat_hash_map<int, std::vector<std::function<void()>>> replay_hooks_;
  // Frees output tensor k's storage (and the other outputs sharing it).
  void FreeTensor(size_t k);
  // Inputs: one IValue per plan input (tensors in it replaced on rebuild).
  std::vector<c10::IValue> input_shapes_;
  size_t num_input_tensors_ = 0;
  std::vector<bool> tensor_copied_;    // per input tensor
  std::vector<torch::Tensor> params_;  // trainable tensors read inside
  // Module slots of the other tensors read by GetAttr inside the range.
  std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Object>, std::string>>
      buffer_slots_;
  // The tensors buffer_slots_ hold now (defined ones).
  std::vector<torch::Tensor> BufferTensors() const;
  // The tensor constants of the range's nodes (the graph holds them: every
  // run of a prim::Constant returns the same tensor).
  std::vector<torch::Tensor> ConstantTensors() const;
  std::vector<bool> input_is_buffer_;  // per input tensor
  std::vector<torch::Tensor> saved_inputs_;
  std::vector<torch::Tensor> dirty_;  // inputs written in forward (outputs)
  std::vector<size_t> dirty_index_;   // their input tensor positions
  std::vector<bool> input_requires_grad_;
  std::vector<size_t> output_tensor_end_;  // per plan output
  // Per container output: per tensor it holds, the input tensor it is or -1
  // (added by the range).
  std::vector<std::vector<int>> container_layout_;
  std::vector<c10::IValue> output_shapes_;
  // Per output tensor: the plan output it belongs to, its storage (weak:
  // autograd decides how long it lives) and whether FreeAfter emptied it.
  std::vector<int> tensor_output_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> tensor_storage_;
  std::vector<bool> tensor_freed_;
  std::vector<const c10::StorageImpl*> tensor_impl_;  // identity only
  std::vector<std::set<const SegmentRun*>> tensor_pinned_by_;
  int forward_last_ = -1;  // largest node id FreeAfter was called with
  // Values tail nodes read that were defined outside the range and the
  // tail, captured in forward, and the RNG state before each tail node.
  absl::flat_hash_map<const torch::jit::Value*, c10::IValue> tail_values_;
  std::vector<std::string> tail_cpu_rng_;
  std::vector<torch::Tensor> tail_device_rng_;
  std::vector<int> tensor_free_after_;
  std::vector<std::set<int>> tensor_readers_;
  int64_t freed_bytes_ = 0;
  // Per output tensor of the replay (in RunForward's order): what Backward
  // needs of it, its gradient edge. The tensors themselves are dropped when
  // the replay ends, so an output nothing saved dies as in the plain step
  // (a range's output that only a node outside the range read: ResNet's
  // downsample branch) instead of living until this segment's backward.
  struct ReplayRoot {
    bool differentiable = false;  // defined and requires grad
    bool leaf = false;            // no grad_fn: its gradient is the result
    torch::autograd::Edge edge;
  };
  std::vector<ReplayRoot> replay_roots_;
  std::vector<torch::Tensor> replay_leaves_;
  std::string cpu_rng_;
  torch::Tensor cuda_rng_;
  bool replayed_ = false;
  std::shared_ptr<torch::autograd::Node> grad_fn_;
};

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_CHECKPOINT_H_
