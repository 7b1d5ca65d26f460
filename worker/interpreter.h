// Runs a Graph (the IR) node by node with autograd on, so that callers can
// observe or intervene between nodes. Constants, attribute reads, control
// flow (prim::If, prim::Loop) and list/tuple/dict plumbing are handled here;
// every other node runs through its registered operator. Values are dropped
// after their last top-level use, as TorchScript's interpreter does, so
// memory behaves like the module's own forward.
//
// Gives exactly the loss and gradients of calling the module (tested).
// Not thread-safe: one Run at a time per Interpreter. The Graph must outlive
// the Interpreter.
#ifndef MUTWO_WORKER_INTERPRETER_H_
#define MUTWO_WORKER_INTERPRETER_H_

#include <torch/script.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/graph.h"

namespace mutwo::worker {

// The values of one run: graph value -> its IValue. A node map: a
// reference to a value stays valid while others are inserted (a flat map
// moves every value when it grows, and `env[out] = env.at(in)` then copied
// from freed memory: an `isDouble()` assert and `InvalidTag` errors that
// came and went with the addresses the map hashed).
using InterpreterEnv =
    absl::node_hash_map<const torch::jit::Value*, c10::IValue>;

struct InterpreterHooks {
  // Called before and after each top-level node (id = IR node id). `outputs`
  // are the node's outputs; a hook may inspect them (the executor may
  // replace them, keeping types).
  std::function<void(int node_id)> before_node;
  std::function<void(int node_id, std::vector<c10::IValue>& outputs)>
      after_node;
  // Called before before_node. Returning a node id `last` >= `node_id`
  // means the hook ran the nodes node_id..last itself and put into `env`
  // every output of theirs that is used after `last`; the interpreter then
  // drops the values whose last use lies in that range and goes on at
  // last + 1 (before_node/after_node are not called for the range). -1:
  // run `node_id` normally. (The executor runs recompute segments so.)
  std::function<int(int node_id, InterpreterEnv& env)> take_over;
  // Called for every prim::If that runs, at any depth (inside loop bodies
  // once per iteration), with the branch it takes: true for the first
  // block ("then"). (worker/specialize records branches so.)
  std::function<void(const torch::jit::Node* node, bool then_branch)> on_branch;
};

class Interpreter {
 public:
  explicit Interpreter(const Graph* graph) : graph_(graph) {}

  // Runs forward on `module` (its `self`) with `inputs` (the arguments after
  // self). Errors: InvalidArgument for a wrong number of inputs or an op that
  // rejects them (naming the node), ResourceExhausted for an out-of-memory
  // (naming the node), Internal for an unsupported node kind.
  [[nodiscard]] absl::StatusOr<c10::IValue> Run(
      const torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
      const InterpreterHooks& hooks = {});

  // Runs the top-level nodes first..last on `env` (which must hold every
  // value they read from outside the range), dropping values after their
  // last use as Run does. Throws what the operators throw (for use inside
  // Run's hooks and autograd functions, which translate errors).
  void RunRange(int first, int last, InterpreterEnv& env);

  // The node that was running when the last Run failed; -1 if none.
  int failed_node() const { return failed_node_; }

 private:
  using Env = InterpreterEnv;

  // What a node needs at each run, looked up once: its operator, its
  // constant, the slot its attribute read takes.
  struct Cached {
    std::optional<torch::jit::Operation> op;
    c10::IValue constant;
    bool has_constant = false;
    c10::ClassTypePtr attribute_type;  // the object type `slot` is of
    size_t slot = 0;
  };

  // One node: control flow, the plumbing and instructions TorchScript's
  // interpreter runs itself, or the node's registered operator.
  void RunNode(torch::jit::Node* node, Env& env);
  // prim::If: the branch taken (reported to hooks_->on_branch).
  void RunIf(torch::jit::Node* node, Env& env);
  // prim::Loop: the body while its condition holds, at most max_trips times.
  void RunLoop(torch::jit::Node* node, Env& env);
  // The instructions that use the interpreter's caches (constants, attribute
  // slots, warn-once) or raise; false when `node` is none of them.
  bool RunInstruction(torch::jit::Node* node, Env& env);
  // Any other node, through its registered operator (looked up once).
  void RunOperator(torch::jit::Node* node, Env& env);
  void RunBlock(torch::jit::Block* block, Env& env);
  Cached& CacheOf(const torch::jit::Node* node);

  const Graph* graph_;
  // A node map: an entry stays where it is while nested blocks add others.
  absl::node_hash_map<const torch::jit::Node*, Cached> cache_;
  absl::flat_hash_set<const torch::jit::Node*> warned_;  // aten::warn, once
  int failed_node_ = -1;
  const torch::jit::Node* running_ = nullptr;  // innermost node running
  const InterpreterHooks* hooks_ = nullptr;    // those of the Run running
};

// True when a LibTorch error is an out-of-memory (CUDA or CPU).
bool IsOutOfMemory(const std::exception& e);

// The first line of an exception's message (a c10::Error's without its
// C++ backtrace).
std::string ExceptionMessage(const std::exception& e);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_INTERPRETER_H_
