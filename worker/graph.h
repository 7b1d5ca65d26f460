// The one IR the profiler, the planner and the executor share.
//
// Built from a module's `forward`: the graph is copied, inlined
// (torch::jit::Inline) and cleaned (EliminateDeadCode), then the nodes of the
// TOP-LEVEL block are numbered in order (node id = index; the block is
// topologically ordered). Nodes inside prim::If / prim::Loop sub-blocks get
// no ids of their own: the control-flow node is one IR node, and its time,
// memory and activations include everything its blocks ran (every iteration
// of a loop). The executor replays such a node as a whole. (With
// --specialize_control_flow the profiler and the executor build the IR
// through worker/specialize.h, which first replaces the Ifs and constant
// loops a training step runs one way by the ops of that way: what stays
// opaque is what it could not specialise.)
//
// The fingerprint hashes node kinds, output counts, sub-block structure and
// data edges (FNV-1a, 64 bit, hex); it is stable across runs and processes
// for the same model file.
//
// Internal to the worker (includes LibTorch). Immutable after Create;
// safe to read from several threads.
#ifndef MUTWO_WORKER_GRAPH_H_
#define MUTWO_WORKER_GRAPH_H_

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/forward_inputs.h"

namespace mutwo::worker {

struct IrNode {
  int id = 0;
  torch::jit::Node* node = nullptr;  // owned by Graph::graph()
  std::string kind;                  // "aten::conv2d"
  std::string scope;                 // "layer1.0.conv1"; "" at the top
  // Producers of the values this node reads, including values its
  // sub-blocks read from outside (data edges; sorted, unique).
  std::vector<int> input_nodes;
  // Nodes reading this node's outputs (sorted, unique).
  std::vector<int> consumers;
  // Largest id reading an output; num_nodes()-1 when an output is returned
  // by forward; the node's own id when nothing reads it.
  int last_use = 0;
  bool returns_output = false;
  // A tensor operator (not a constant, attribute read, list/tuple plumbing);
  // control flow counts as an op when its blocks contain one.
  bool is_op = false;
  // Values to drop after this node ran (their last top-level use).
  std::vector<const torch::jit::Value*> dead_after;
};

// The node kind of a control-flow guard (worker/specialize.h): checks at
// run time that a specialised prim::If takes the branch it took when the
// graph was built. Not an op (it computes nothing the planner could keep).
inline constexpr char kBranchGuardKind[] = "mutwo::guard_branch";

// `module`'s forward graph, copied, inlined and cleaned as Graph::Create
// does it (the module's constant settings folded), not yet numbered; for
// passes that rewrite it before Graph::Create(module, graph) numbers it.
// The `omitted` arguments (worker/forward_inputs.h) are constants of it.
// InvalidArgument when the module has no forward or it cannot be inlined.
[[nodiscard]] absl::StatusOr<std::shared_ptr<torch::jit::Graph>> ForwardGraph(
    const torch::jit::Module& module,
    const std::vector<OmittedArgument>& omitted = {});

class Graph {
 public:
  // `module` must have a forward method (see LoadModule).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Graph>> Create(
      const torch::jit::Module& module,
      const std::vector<OmittedArgument>& omitted = {});
  // Numbers `forward`, a graph ForwardGraph(module) gave (possibly rewritten
  // since; it must stay topologically ordered). Takes it over.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Graph>> Create(
      const torch::jit::Module& module,
      std::shared_ptr<torch::jit::Graph> forward);

  const std::vector<IrNode>& nodes() const { return nodes_; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  const std::string& fingerprint() const { return fingerprint_; }
  const std::shared_ptr<torch::jit::Graph>& graph() const { return graph_; }
  // Number of forward arguments after `self`.
  int num_inputs() const;
  // Top-level node id producing `value`; -1 for graph inputs.
  int ProducerOf(const torch::jit::Value* value) const;
  // "12 (aten::conv2d, layer1.0.conv1)"
  std::string Describe(int id) const;

 private:
  Graph() = default;

  std::shared_ptr<torch::jit::Graph> graph_;
  std::vector<IrNode> nodes_;
  absl::flat_hash_map<const torch::jit::Node*, int> id_of_;
  std::string fingerprint_;
};

// Module path of a node from its inlined call stack ("layer1.0.conv1"),
// resolved against `root` (the module the graph came from) where given, so
// that an element of a container the forward never calls keeps the
// container's name ("encoder.layers.0", not "encoder.0"), as
// nn.Module.named_modules() names it.
std::string ScopeOf(const torch::jit::Node* node,
                    const torch::jit::Module* root = nullptr);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_GRAPH_H_
