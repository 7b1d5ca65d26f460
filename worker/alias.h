// One alias analysis of the IR for the profiler's lineage and the
// executor's segments: which values share a storage (schema alias
// annotations: views and in-place results), which values a node reads or
// writes (nested blocks included), and which tensors may sit in which
// containers (lists, dicts, tuples). Static, over the inlined graph; free
// functions, as PyTorch JIT's passes/utils/memory_dag.h serves its passes.
// Internal to the worker (includes LibTorch headers).
#ifndef MUTWO_WORKER_ALIAS_H_
#define MUTWO_WORKER_ALIAS_H_

#include <torch/script.h>

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "worker/graph.h"

namespace mutwo::worker {

// Calls `fn` for every value `node` and its nested blocks read.
template <typename Fn>
inline void ForEachRead(const torch::jit::Node* node, const Fn& fn) {
  for (const torch::jit::Value* value : node->inputs()) fn(value);
  for (const torch::jit::Block* block : node->blocks()) {
    for (const torch::jit::Node* inner : block->nodes()) ForEachRead(inner, fn);
    for (const torch::jit::Value* value : block->outputs()) fn(value);
  }
}

// Calls `fn` for every node in `node`'s nested blocks and `node` itself.
template <typename Fn>
inline void ForEachNested(const torch::jit::Node* node, const Fn& fn) {
  fn(node);
  for (const torch::jit::Block* block : node->blocks()) {
    for (const torch::jit::Node* inner : block->nodes()) {
      ForEachNested(inner, fn);
    }
  }
}

// Values `node` itself writes in place (schema `(a!)`), not the nodes nested
// in its blocks: an operator's own writes. Control flow (no schema) writes
// nothing here.
template <typename Fn>
inline void ForEachWrittenByOp(const torch::jit::Node* node, const Fn& fn) {
  const c10::FunctionSchema* schema = node->maybeSchema();
  if (schema == nullptr) return;
  const auto& args = schema->arguments();
  for (size_t i = 0; i < args.size() && i < node->inputs().size(); ++i) {
    const c10::AliasInfo* alias = args[i].alias_info();
    if (alias != nullptr && alias->isWrite()) fn(node->input(i));
  }
}

// Whether `node` itself writes one of its inputs in place (ForEachWrittenByOp
// finds one). The profiler's lineage asks this of the top-level nodes that
// expose a storage: a control-flow node whose blocks write in place does not
// count there, while ForEachWritten (the executor's segments) counts it.
bool WritesInPlace(const torch::jit::Node* node);

// Values `node` (or a node nested in it) writes in place (schema `(a!)`).
template <typename Fn>
inline void ForEachWritten(const torch::jit::Node* node, const Fn& fn) {
  ForEachNested(node,
                [&](const torch::jit::Node* n) { ForEachWrittenByOp(n, fn); });
}

// Whether `value` is made inside `node`'s nested blocks (at any depth), so
// that running `node` again makes it again.
bool DefinedWithin(const torch::jit::Value* value,
                   const torch::jit::Node* node);

bool IsTensorType(const c10::TypePtr& type);
// Tensor or a list of tensors (nn.LSTM's `_flat_weights`).
bool HoldsTensors(const c10::TypePtr& type);
// A mutable container (list or dict): the graph may append to it or set an
// entry in place, so a value of this type can change after it was read.
bool IsMutableContainer(const c10::TypePtr& type);
// A type that may hold a tensor (a container of tensors, at any depth).
bool MayHoldTensor(const c10::TypePtr& type);

// The value whose storage `value` uses: follows view and in-place results
// (schema alias annotations) back to the value that owns the storage.
const torch::jit::Value* AliasRoot(const torch::jit::Value* value);
// One step of AliasRoot: the input `value` may share its storage with (its
// schema's alias set), or nullptr.
const torch::jit::Value* AliasedInput(const torch::jit::Value* value);

// Union-find over alias roots: a tensor and the containers it may be put in
// or taken from (prim::ListConstruct, aten::append's `t(c -> *)`,
// aten::__getitem__'s `t(*)`) are one class. Values of other types stay
// alone.
class ContainerClasses {
 public:
  const torch::jit::Value* Find(const torch::jit::Value* v) const {
    auto it = parent_.find(v);
    if (it == parent_.end() || it->second == v) return v;
    return Find(it->second);
  }
  void Union(const torch::jit::Value* a, const torch::jit::Value* b) {
    a = Find(a);
    b = Find(b);
    if (a != b) parent_[a] = b;
  }

 private:
  absl::flat_hash_map<const torch::jit::Value*, const torch::jit::Value*>
      parent_;
};

ContainerClasses ContainerAliasClasses(const Graph& graph);

// Roots of the lists and dicts some node of `graph` writes in place
// (aten::append, aten::_set_item, ...): their contents when a node reads
// them depend on where it runs, not only on how they were built.
absl::flat_hash_set<const torch::jit::Value*> MutatedContainers(
    const Graph& graph);

// Roots that may stand for any tensor of their class (ContainerClasses):
// containers holding tensors, and values taken out of one (aten::__getitem__'s
// `t(*)`, prim::ListUnpack, control flow over containers).
absl::flat_hash_set<const torch::jit::Value*> OpaqueRoots(const Graph& graph);

// Per alias root: the top-level nodes (ids, increasing) that read it,
// through any alias and through the containers it may have been put in (a
// tensor appended to a list is read by whatever reads the list, or what was
// taken out of it; not by the readers of the other tensors put there).
// An opaque root is read by every reader of its class.
absl::flat_hash_map<const torch::jit::Value*, std::vector<int>> ReadersByRoot(
    const Graph& graph);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_ALIAS_H_
