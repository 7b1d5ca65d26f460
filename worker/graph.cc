#include "worker/graph.h"

#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace mutwo::worker {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

// The top-level node that contains `node` (itself when at the top).
const Node* TopLevelOwner(const Node* node, const Block* top) {
  while (node->owningBlock() != top) {
    node = node->owningBlock()->owningNode();
  }
  return node;
}

bool IsOpNode(const Node* node) {
  const c10::Symbol kind = node->kind();
  static const c10::Symbol guard =
      c10::Symbol::fromQualString(kBranchGuardKind);
  if (kind == guard) return false;
  if (kind == c10::prim::If || kind == c10::prim::Loop) {
    for (const Block* block : node->blocks()) {
      for (const Node* inner : block->nodes()) {
        if (IsOpNode(inner)) return true;
      }
    }
    return false;
  }
  if (kind.is_prim()) return kind == c10::prim::NumToTensor;
  return true;
}

// Calls `fn` for every value `node` and its nested blocks read.
template <typename Fn>
void ForEachInput(const Node* node, const Fn& fn) {
  for (const Value* value : node->inputs()) fn(value);
  for (const Block* block : node->blocks()) {
    for (const Node* inner : block->nodes()) ForEachInput(inner, fn);
    for (const Value* value : block->outputs()) fn(value);
  }
}

// Canonical text of the graph's structure, hashed into the fingerprint.
class Canonicalizer {
 public:
  std::string Run(const torch::jit::Graph& graph) {
    for (const Value* input : graph.inputs()) Number(input);
    absl::StrAppend(&text_, "in", graph.inputs().size(), ";");
    AppendBlock(graph.block());
    return text_;
  }

 private:
  void Number(const Value* value) {
    const int next = static_cast<int>(numbers_.size());
    numbers_.emplace(value, next);
  }
  int NumberOf(const Value* value) {
    auto it = numbers_.find(value);
    return it == numbers_.end() ? -1 : it->second;
  }
  void AppendBlock(const Block* block) {
    for (const Node* node : block->nodes()) {
      absl::StrAppend(&text_, node->kind().toQualString(), "(");
      for (const Value* input : node->inputs()) {
        absl::StrAppend(&text_, NumberOf(input), ",");
      }
      absl::StrAppend(&text_, ")", node->outputs().size());
      for (const Block* inner : node->blocks()) {
        for (const Value* param : inner->inputs()) Number(param);
        absl::StrAppend(&text_, "{", inner->inputs().size(), ":");
        AppendBlock(inner);
        absl::StrAppend(&text_, "}");
      }
      for (const Value* output : node->outputs()) Number(output);
      absl::StrAppend(&text_, ";");
    }
    absl::StrAppend(&text_, "->");
    for (const Value* output : block->outputs()) {
      absl::StrAppend(&text_, NumberOf(output), ",");
    }
  }

  absl::flat_hash_map<const Value*, int> numbers_;
  std::string text_;
};

uint64_t Fnv1a64(const std::string& text) {
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return hash;
}

// Replaces reads of the module's constant settings (bool, int, float, str
// and None attributes: `self.training`, `self.use_res_connect`,
// `self.downsample is not None`) by constants, then folds the branches and
// arithmetic that depended on them, so the IR holds the ops a training step
// runs, not both arms of every configuration `if` (an untaken arm that
// writes a tensor in place or reads another would otherwise count as if it
// ran). Attributes the graph assigns (prim::SetAttr) stay reads.
void FoldConstantAttributes(std::shared_ptr<torch::jit::Graph>& shared,
                            const torch::jit::Module& module) {
  torch::jit::Graph& graph = *shared;
  std::set<std::string> assigned;
  auto visit_all = [&](auto&& fn) {
    std::vector<torch::jit::Block*> blocks{graph.block()};
    while (!blocks.empty()) {
      torch::jit::Block* block = blocks.back();
      blocks.pop_back();
      for (Node* node : block->nodes()) {
        fn(node);
        for (torch::jit::Block* inner : node->blocks()) blocks.push_back(inner);
      }
    }
  };
  visit_all([&](Node* node) {
    if (node->kind() == c10::prim::SetAttr) {
      assigned.insert(node->s(c10::attr::name));
    }
  });
  const torch::jit::Value* self = graph.inputs()[0];
  std::vector<Node*> reads;
  visit_all([&](Node* node) {
    if (node->kind() == c10::prim::GetAttr) reads.push_back(node);
  });
  bool folded = false;
  for (Node* node : reads) {
    const std::string& name = node->s(c10::attr::name);
    if (assigned.count(name) != 0) continue;
    const c10::TypeKind kind = node->output()->type()->kind();
    if (kind != c10::TypeKind::BoolType && kind != c10::TypeKind::IntType &&
        kind != c10::TypeKind::FloatType && kind != c10::TypeKind::StringType &&
        kind != c10::TypeKind::NoneType) {
      continue;
    }
    // The object: a chain of GetAttr from `self`.
    std::vector<std::string> path{name};
    const torch::jit::Value* object = node->input(0);
    bool rooted = true;
    while (object != self) {
      if (object->node()->kind() != c10::prim::GetAttr) {
        rooted = false;
        break;
      }
      if (assigned.count(object->node()->s(c10::attr::name)) != 0) {
        rooted = false;
        break;
      }
      path.push_back(object->node()->s(c10::attr::name));
      object = object->node()->input(0);
    }
    if (!rooted) continue;
    c10::IValue value = module._ivalue();
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      if (!value.isObject()) {
        rooted = false;
        break;
      }
      value = value.toObject()->getAttr(*it);
    }
    if (!rooted) continue;
    torch::jit::WithInsertPoint guard(node);
    torch::jit::Value* constant = graph.insertConstant(value);
    node->output()->replaceAllUsesWith(constant);
    folded = true;
  }
  if (!folded) return;
  // torch::jit::ConstantPropagation analyses aliasing once and keeps using
  // that analysis while it rewrites the graph: a value allocated where a
  // destroyed one lived can read as written to, and folding stops there. So
  // where one pass stopped depended on the allocator (on CUDA, a 2.11
  // nn.TransformerEncoder kept `len(why_not_fast_path) > 0` unfolded in 5 of
  // 6 processes and folded it in the sixth: two fingerprints for one file).
  // Passes until one changes nothing reach the same graph every time (a pass
  // that changes nothing never reads a stale analysis); the dead code goes
  // between passes, or a folded node still in the graph would fold again.
  constexpr int kMaxPasses = 64;
  for (int pass = 0;
       pass < kMaxPasses && torch::jit::ConstantPropagation(shared); ++pass) {
    torch::jit::EliminateDeadCode(shared);
  }
  torch::jit::EliminateDeadCode(shared);
}

}  // namespace

namespace {

// The child of `module` the inliner recorded as `name` of type `type`: a
// direct child, else the element `name` of a child container that is never
// called itself (nn.ModuleList / nn.ModuleDict: the inliner records only the
// last attribute of `self.layers.0`, so the container's name is lost). Sets
// `path` to the child's path below `module`; false if none or several fit.
bool FindChild(const torch::jit::Module& module, const std::string& name,
               const c10::ClassTypePtr& type, torch::jit::Module* child,
               std::string* path) {
  for (const auto& c : module.named_children()) {
    if (c.name == name && c.value.type() == type) {
      *child = c.value;
      *path = name;
      return true;
    }
  }
  int found = 0;
  for (const auto& c : module.named_children()) {
    for (const auto& g : c.value.named_children()) {
      if (g.name == name && g.value.type() == type) {
        *child = g.value;
        *path = absl::StrCat(c.name, ".", name);
        ++found;
      }
    }
  }
  return found == 1;
}

}  // namespace

std::string ScopeOf(const Node* node, const torch::jit::Module* root) {
  auto callstack = node->callstack();
  if (!callstack.has_value()) return "";
  std::vector<std::string> parts;
  std::optional<torch::jit::Module> at;
  if (root != nullptr) at = *root;
  for (const auto& entry : (*callstack)->vec()) {
    const auto& info = std::get<2>(entry);
    // "SELF" marks a call to another method of the same module.
    if (!info.has_value() || info->instance_name().empty() ||
        info->instance_name() == "SELF") {
      continue;
    }
    torch::jit::Module child;
    std::string path;
    if (at.has_value() && FindChild(*at, info->instance_name(),
                                    info->class_type(), &child, &path)) {
      parts.push_back(path);
      at = child;
    } else {
      parts.push_back(info->instance_name());
      at.reset();  // below an unresolved name, only names
    }
  }
  return absl::StrJoin(parts, ".");
}

absl::StatusOr<std::shared_ptr<torch::jit::Graph>> ForwardGraph(
    const torch::jit::Module& module,
    const std::vector<OmittedArgument>& omitted) {
  auto method = module.find_method("forward");
  if (!method.has_value()) {
    return absl::InvalidArgumentError("the module has no forward method");
  }
  // Inline takes each callee's "optimized" graph, which LibTorch only
  // pre-inlines while graph-executor optimization is on; with it off (as a
  // reference run may leave it) calls nested two levels deep would stay as
  // prim::CallMethod. So it is on while the IR is built, whatever the caller
  // set: the same file always gives the same IR and fingerprint.
  const bool optimize = torch::jit::getGraphExecutorOptimize();
  torch::jit::setGraphExecutorOptimize(true);
  std::shared_ptr<torch::jit::Graph> graph;
  try {
    graph = method->graph()->copy();
    torch::jit::Inline(*graph);
    BindOmittedArguments(graph, omitted);
    torch::jit::EliminateDeadCode(graph);
    FoldConstantAttributes(graph, module);
  } catch (const c10::Error& e) {
    torch::jit::setGraphExecutorOptimize(optimize);
    return absl::InvalidArgumentError(
        absl::StrCat("cannot inline forward: ", e.msg()));
  }
  torch::jit::setGraphExecutorOptimize(optimize);
  return graph;
}

absl::StatusOr<std::unique_ptr<Graph>> Graph::Create(
    const torch::jit::Module& module,
    const std::vector<OmittedArgument>& omitted) {
  auto forward = ForwardGraph(module, omitted);
  if (!forward.ok()) return forward.status();
  return Create(module, *std::move(forward));
}

absl::StatusOr<std::unique_ptr<Graph>> Graph::Create(
    const torch::jit::Module& module,
    std::shared_ptr<torch::jit::Graph> forward) {
  if (forward == nullptr) {
    return absl::InvalidArgumentError("no forward graph to number");
  }
  std::unique_ptr<Graph> out(new Graph());
  out->graph_ = std::move(forward);
  const Block* top = out->graph_->block();
  for (Node* node : out->graph_->nodes()) {
    IrNode ir;
    ir.id = static_cast<int>(out->nodes_.size());
    ir.node = node;
    ir.kind = node->kind().toQualString();
    ir.scope = ScopeOf(node, &module);
    ir.is_op = IsOpNode(node);
    out->id_of_[node] = ir.id;
    out->nodes_.push_back(std::move(ir));
  }
  const int n = out->num_nodes();
  std::vector<std::set<int>> inputs(n), consumers(n);
  for (IrNode& ir : out->nodes_) {
    ForEachInput(ir.node, [&](const Value* value) {
      const Node* owner = TopLevelOwner(value->node(), top);
      auto it = out->id_of_.find(owner);
      if (it == out->id_of_.end() || it->second == ir.id) return;
      inputs[ir.id].insert(it->second);
      consumers[it->second].insert(ir.id);
    });
  }
  for (IrNode& ir : out->nodes_) {
    ir.input_nodes.assign(inputs[ir.id].begin(), inputs[ir.id].end());
    ir.consumers.assign(consumers[ir.id].begin(), consumers[ir.id].end());
    ir.last_use = ir.id;
    for (const Value* output : ir.node->outputs()) {
      int last = ir.id;
      bool returned = false;
      for (const torch::jit::Use& use : output->uses()) {
        if (use.user == out->graph_->return_node()) {
          returned = true;
          continue;
        }
        const Node* owner = TopLevelOwner(use.user, top);
        auto it = out->id_of_.find(owner);
        if (it != out->id_of_.end()) last = std::max(last, it->second);
      }
      if (returned) {
        ir.returns_output = true;
        ir.last_use = n - 1;
      } else {
        ir.last_use = std::max(ir.last_use, last);
        out->nodes_[last].dead_after.push_back(output);
      }
    }
  }
  const uint64_t hash = Fnv1a64(Canonicalizer().Run(*out->graph_));
  out->fingerprint_ = absl::StrFormat("%016x", hash);
  MUTWO_LOG(trace, "IR (fingerprint {}, {} nodes):\n{}", out->fingerprint_,
            out->num_nodes(), out->graph_->toString());
  return out;
}

int Graph::num_inputs() const {
  return static_cast<int>(graph_->inputs().size()) - 1;
}

int Graph::ProducerOf(const Value* value) const {
  const Node* owner = TopLevelOwner(value->node(), graph_->block());
  auto it = id_of_.find(owner);
  return it == id_of_.end() ? -1 : it->second;
}

std::string Graph::Describe(int id) const {
  if (id < 0 || id >= num_nodes()) return absl::StrCat(id);
  const IrNode& ir = nodes_[id];
  return ir.scope.empty()
             ? absl::StrCat(id, " (", ir.kind, ")")
             : absl::StrCat(id, " (", ir.kind, ", ", ir.scope, ")");
}

}  // namespace mutwo::worker
