#include "worker/specialize.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "worker/interpreter.h"

namespace mutwo::worker {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

// mutwo::guard_branch(bool cond, bool taken, str message) -> ():
// throws `message` when `cond` != `taken`. Conservative alias analysis
// marks it as having side effects, so dead-code elimination keeps it.
void GuardBranch(torch::jit::Stack& stack) {
  const std::string message = stack.back().toStringRef();
  stack.pop_back();
  const bool taken = stack.back().toBool();
  stack.pop_back();
  const bool cond = stack.back().toBool();
  stack.pop_back();
  if (cond != taken) throw std::runtime_error(message);
}

const torch::jit::RegisterOperators kGuardRegistry({torch::jit::Operator(
    absl::StrCat(kBranchGuardKind,
                 "(bool cond, bool taken, str message) -> ()"),
    torch::jit::Operation(&GuardBranch),
    c10::AliasAnalysisKind::CONSERVATIVE)});

c10::Symbol GuardSymbol() {
  static const c10::Symbol symbol =
      c10::Symbol::fromQualString(kBranchGuardKind);
  return symbol;
}

bool InsideLoop(const Node* node) {
  for (const Block* block = node->owningBlock();
       block != nullptr && block->owningNode() != nullptr;
       block = block->owningNode()->owningBlock()) {
    if (block->owningNode()->kind() == c10::prim::Loop) return true;
  }
  return false;
}

int CountNodes(const Block* block) {
  int count = 0;
  for (const Node* node : block->nodes()) {
    ++count;
    for (const Block* inner : node->blocks()) count += CountNodes(inner);
  }
  return count;
}

std::optional<c10::IValue> ConstantOf(const Value* value) {
  if (value->node()->kind() != c10::prim::Constant) return std::nullopt;
  auto ivalue = torch::jit::toIValue(value);
  if (!ivalue.has_value()) return std::nullopt;
  return *ivalue;
}

// The trip count of a loop that unrolling may replace; nullopt if the trip
// count or the (initial and per-iteration) condition is not a constant.
std::optional<int64_t> UnrollableTrips(const Node* loop, int max_trips) {
  auto trips = ConstantOf(loop->input(0));
  auto cond = ConstantOf(loop->input(1));
  auto again = ConstantOf(loop->blocks()[0]->outputs()[0]);
  if (!trips.has_value() || !trips->isInt() || !cond.has_value() ||
      !cond->isBool() || !again.has_value() || !again->isBool()) {
    return std::nullopt;
  }
  if (!cond->toBool()) return 0;              // never runs
  if (!again->toBool()) return std::nullopt;  // a loop that breaks
  const int64_t n = trips->toInt();
  if (n > max_trips) return std::nullopt;
  return std::max<int64_t>(n, 0);
}

// Replaces `loop` by `trips` copies of its body, in order.
void Unroll(torch::jit::Graph& graph, Node* loop, int64_t trips) {
  Block* body = loop->blocks()[0];
  std::vector<Value*> carried(loop->inputs().begin() + 2, loop->inputs().end());
  torch::jit::WithInsertPoint point(loop);
  for (int64_t trip = 0; trip < trips; ++trip) {
    absl::flat_hash_map<Value*, Value*> env;
    env[body->inputs()[0]] = graph.insertConstant(trip);
    for (size_t i = 0; i < carried.size(); ++i) {
      env[body->inputs()[i + 1]] = carried[i];
    }
    auto lookup = [&](Value* value) {
      auto it = env.find(value);
      return it == env.end() ? value : it->second;
    };
    for (Node* node : body->nodes()) {
      Node* copy = graph.createClone(node, lookup);
      graph.insertNode(copy);
      for (size_t i = 0; i < node->outputs().size(); ++i) {
        env[node->outputs()[i]] = copy->outputs()[i];
      }
    }
    for (size_t i = 0; i < carried.size(); ++i) {
      carried[i] = lookup(body->outputs()[i + 1]);
    }
  }
  for (size_t i = 0; i < carried.size(); ++i) {
    loop->outputs()[i]->replaceAllUsesWith(carried[i]);
  }
  loop->destroy();
}

// The first loop (preorder) that may be unrolled within `budget` added
// nodes, or nullptr; loops found too big go into `refused`.
Node* NextUnrollable(Block* block, int max_trips, int budget,
                     absl::flat_hash_set<const Node*>& refused,
                     int64_t* trips) {
  for (Node* node : block->nodes()) {
    if (node->kind() == c10::prim::Loop && refused.count(node) == 0) {
      auto n = UnrollableTrips(node, max_trips);
      if (n.has_value() && *n * CountNodes(node->blocks()[0]) <= budget) {
        *trips = *n;
        return node;
      }
      refused.insert(node);
    }
    for (Block* inner : node->blocks()) {
      Node* found = NextUnrollable(inner, max_trips, budget, refused, trips);
      if (found != nullptr) return found;
    }
  }
  return nullptr;
}

// The message of the first prim::RaiseException directly in `block` when
// it is a constant string ("" otherwise): a branch that only raises is an
// assertion, and its message says what the model expected.
std::string RaisedMessage(const Block* block) {
  for (const Node* node : block->nodes()) {
    if (node->kind() != c10::prim::RaiseException) continue;
    auto message = ConstantOf(node->input(0));
    if (message.has_value() && message->isString()) {
      return message->toStringRef();
    }
  }
  return "";
}

std::string GuardMessage(const Node* branch, const Block* other,
                         const torch::jit::Module& module) {
  const std::string scope = ScopeOf(branch, &module);
  std::string message = absl::StrCat(
      "mutwo: control flow at ",
      scope.empty() ? std::string("the top level of forward") : scope,
      " took the other branch than when the model was profiled; re-profile "
      "with these inputs, or profile and execute with "
      "--specialize_control_flow=false");
  const std::string raised = RaisedMessage(other);
  if (!raised.empty())
    absl::StrAppend(&message, " (that branch raises: ", raised, ")");
  return message;
}

// Replaces `node` (a prim::If) by a guard and the nodes of its block
// `then_branch ? 0 : 1`.
void Specialize(torch::jit::Graph& graph, Node* node, bool then_branch,
                const torch::jit::Module& module) {
  Block* body = node->blocks()[then_branch ? 0 : 1];
  const Block* other = node->blocks()[then_branch ? 1 : 0];
  {
    torch::jit::WithInsertPoint point(node);
    Value* taken = graph.insertConstant(then_branch);
    Value* message = graph.insertConstant(GuardMessage(node, other, module));
    Node* guard = graph.create(GuardSymbol(), {node->input(0), taken, message},
                               /*num_outputs=*/0);
    guard->setSourceRange(node->sourceRange());
    if (node->callstack().has_value()) guard->setCallStack(*node->callstack());
    graph.insertNode(guard);
  }
  for (auto it = body->nodes().begin(); it != body->nodes().end();) {
    Node* inner = *it;
    ++it;  // before the move takes `inner` out of the block
    inner->moveBefore(node);
  }
  for (size_t i = 0; i < node->outputs().size(); ++i) {
    node->outputs()[i]->replaceAllUsesWith(body->outputs()[i]);
  }
  node->destroy();
}

}  // namespace

int UnrollConstantLoops(torch::jit::Graph& graph,
                        const SpecializeOptions& options) {
  int unrolled = 0;
  int budget = options.max_unrolled_nodes;
  absl::flat_hash_set<const Node*> refused;
  while (true) {
    int64_t trips = 0;
    Node* loop = NextUnrollable(graph.block(), options.max_unrolled_trips,
                                budget, refused, &trips);
    if (loop == nullptr) break;
    budget -= static_cast<int>(trips) * CountNodes(loop->blocks()[0]);
    Unroll(graph, loop, trips);
    ++unrolled;
  }
  return unrolled;
}

absl::StatusOr<absl::flat_hash_map<const Node*, bool>> RecordBranches(
    const Graph& graph, const torch::jit::Module& module,
    const std::vector<c10::IValue>& inputs, const SpecializeOptions& options) {
  // What a run saw of each If: the branches it took (several entries when
  // it ran several times).
  using Seen = absl::flat_hash_map<const Node*, std::vector<bool>>;
  std::vector<torch::Tensor> buffers, saved;
  {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& b : module.buffers()) {
      buffers.push_back(b);
      saved.push_back(b.clone());
    }
  }
  auto restore = [&]() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
  };
  auto record = [&](bool grad) -> absl::StatusOr<std::vector<Seen>> {
    std::vector<Seen> runs;
    for (int run = 0; run < std::max(1, options.recording_runs); ++run) {
      Seen seen;
      InterpreterHooks hooks;
      hooks.on_branch = [&](const Node* node, bool then_branch) {
        seen[node].push_back(then_branch);
      };
      Interpreter interpreter(&graph);
      torch::AutoGradMode mode(grad);
      auto out = interpreter.Run(module, inputs, hooks);
      restore();
      if (!out.ok()) return out.status();
      runs.push_back(std::move(seen));
    }
    return runs;
  };
  // As the step runs it: with autograd (`torch.is_grad_enabled()` may
  // decide a branch). A forward that holds its activations may not fit
  // where a schedule does (the executor under a memory limit); then
  // without, which frees them as it goes.
  auto runs = record(true);
  if (!runs.ok() && absl::IsResourceExhausted(runs.status())) {
    runs = record(false);
  }
  if (!runs.ok()) return runs.status();
  absl::flat_hash_map<const Node*, bool> taken;
  for (const auto& [node, branches] : runs->front()) {
    if (branches.size() != 1 || InsideLoop(node)) continue;
    bool same = true;
    for (const Seen& other : *runs) {
      auto it = other.find(node);
      same &= it != other.end() && it->second == branches;
    }
    if (same) taken.emplace(node, branches.front());
  }
  return taken;
}

int SpecializeBranches(torch::jit::Graph& graph,
                       const absl::flat_hash_map<const Node*, bool>& taken,
                       const torch::jit::Module& module) {
  int specialized = 0;
  bool changed = true;
  while (changed) {  // once more per level of nesting
    changed = false;
    Block* top = graph.block();
    for (auto it = top->nodes().begin(); it != top->nodes().end();) {
      Node* node = *it;
      ++it;  // the inlined nodes go before `node`, so before `it`
      if (node->kind() != c10::prim::If) continue;
      auto found = taken.find(node);
      if (found == taken.end()) continue;
      Specialize(graph, node, found->second, module);
      ++specialized;
      changed = true;
    }
  }
  return specialized;
}

absl::StatusOr<std::unique_ptr<Graph>> CreateSpecializedGraph(
    const torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
    const SpecializeOptions& options, SpecializeStats* stats) {
  SpecializeStats local;
  if (stats == nullptr) stats = &local;
  *stats = SpecializeStats();
  auto forward = ForwardGraph(module, options.omitted_arguments);
  if (!forward.ok()) return forward.status();
  std::shared_ptr<torch::jit::Graph> graph = *std::move(forward);
  try {
    stats->loops_unrolled = UnrollConstantLoops(*graph, options);
    if (stats->loops_unrolled > 0) torch::jit::EliminateDeadCode(graph);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot unroll forward's loops: ", e.msg()));
  }
  absl::flat_hash_map<const Node*, bool> taken;
  {
    // Numbered only to run it; its ids die with it.
    auto recording = Graph::Create(module, graph);
    if (!recording.ok()) return recording.status();
    auto recorded = RecordBranches(**recording, module, inputs, options);
    if (recorded.ok()) {
      taken = *std::move(recorded);
    } else {
      stats->recording_error = std::string(recorded.status().message());
    }
  }
  try {
    stats->ifs_specialized = SpecializeBranches(*graph, taken, module);
    if (stats->ifs_specialized > 0) torch::jit::EliminateDeadCode(graph);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot specialise forward's control flow: ", e.msg()));
  }
  for (const Node* node : graph->nodes()) {
    stats->ifs_kept += node->kind() == c10::prim::If;
  }
  return Graph::Create(module, graph);
}

}  // namespace mutwo::worker
