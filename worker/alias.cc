#include "worker/alias.h"

#include <set>

namespace mutwo::worker {
namespace {

using torch::jit::Node;
using torch::jit::Value;

bool SameSets(const c10::AliasInfo& a, const c10::AliasInfo& b) {
  for (const c10::Symbol& s : a.beforeSets()) {
    if (b.beforeSets().count(s) != 0) return true;
  }
  return false;
}

bool IsContainerHoldingTensors(const c10::TypePtr& type) {
  return type->kind() != c10::TypeKind::TensorType && MayHoldTensor(type);
}

bool EntersOrLeavesWildcard(const c10::AliasInfo* info) {
  if (info == nullptr) return false;
  if (info->isWildcardBefore() || info->isWildcardAfter()) return true;
  for (const c10::AliasInfo& contained : info->containedTypes()) {
    if (EntersOrLeavesWildcard(&contained)) return true;
  }
  return false;
}

// Interpreter plumbing (list/tuple/dict construct and unpack, control flow:
// no schema) with a container of tensors among its inputs or outputs.
bool IsContainerPlumbing(const Node* node) {
  if (node->maybeSchema() != nullptr) return false;
  for (const Value* v : node->inputs()) {
    if (IsContainerHoldingTensors(v->type())) return true;
  }
  for (const Value* v : node->outputs()) {
    if (IsContainerHoldingTensors(v->type())) return true;
  }
  return false;
}

}  // namespace

bool IsTensorType(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

bool HoldsTensors(const c10::TypePtr& type) {
  if (IsTensorType(type)) return true;
  if (auto list = type->cast<c10::ListType>()) {
    return IsTensorType(list->getElementType());
  }
  return false;
}

bool IsMutableContainer(const c10::TypePtr& type) {
  return type->kind() == c10::TypeKind::ListType ||
         type->kind() == c10::TypeKind::DictType;
}

bool MayHoldTensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  for (const c10::TypePtr& contained : type->containedTypes()) {
    if (MayHoldTensor(contained)) return true;
  }
  return false;
}

bool DefinedWithin(const torch::jit::Value* value,
                   const torch::jit::Node* node) {
  for (const torch::jit::Block* block = value->node()->owningBlock();
       block != nullptr && block->owningNode() != nullptr;
       block = block->owningNode()->owningBlock()) {
    if (block->owningNode() == node) return true;
  }
  return false;
}

bool WritesInPlace(const Node* node) {
  bool writes = false;
  ForEachWrittenByOp(node, [&](const Value* /*value*/) { writes = true; });
  return writes;
}

const Value* AliasedInput(const Value* value) {
  const Node* node = value->node();
  const c10::FunctionSchema* schema = node->maybeSchema();
  if (schema == nullptr || value->offset() >= schema->returns().size()) {
    return nullptr;
  }
  const c10::AliasInfo* out = schema->returns()[value->offset()].alias_info();
  if (out == nullptr) return nullptr;
  const auto& args = schema->arguments();
  for (size_t i = 0; i < args.size() && i < node->inputs().size(); ++i) {
    const c10::AliasInfo* in = args[i].alias_info();
    if (in != nullptr && SameSets(*in, *out)) return node->input(i);
  }
  return nullptr;
}

const Value* AliasRoot(const Value* value) {
  while (const Value* next = AliasedInput(value)) value = next;
  return value;
}

ContainerClasses ContainerAliasClasses(const Graph& graph) {
  ContainerClasses classes;
  for (const IrNode& ir : graph.nodes()) {
    ForEachNested(ir.node, [&](const Node* node) {
      const c10::FunctionSchema* schema = node->maybeSchema();
      // Containers this node makes or writes, and the tensors (or other
      // containers) that go in or come out.
      std::vector<const Value*> containers, members;
      if (schema == nullptr) {
        // Interpreter plumbing: every output may hold or be what went in.
        if (!IsContainerPlumbing(node)) return;
        for (const Value* v : node->inputs()) {
          if (MayHoldTensor(v->type())) members.push_back(v);
        }
        for (const Value* v : node->outputs()) {
          if (MayHoldTensor(v->type())) members.push_back(v);
        }
        for (size_t i = 1; i < members.size(); ++i) {
          classes.Union(AliasRoot(members[0]), AliasRoot(members[i]));
        }
        return;
      }
      const auto& args = schema->arguments();
      // Containers read without an annotation: what leaves as a wildcard
      // came out of them (aten::__getitem__.Dict_str(Dict(str, t) self,
      // str key) -> t(*)).
      std::vector<const Value*> read_containers;
      for (size_t i = 0; i < args.size() && i < node->inputs().size(); ++i) {
        const Value* v = node->input(i);
        if (!MayHoldTensor(v->type())) continue;
        const c10::AliasInfo* info = args[i].alias_info();
        if (info != nullptr && info->isWrite() &&
            IsContainerHoldingTensors(v->type())) {
          containers.push_back(v);
        } else if (EntersOrLeavesWildcard(info)) {
          members.push_back(v);
        } else if (IsContainerHoldingTensors(v->type())) {
          (info != nullptr ? containers : read_containers).push_back(v);
        }
      }
      const auto& returns = schema->returns();
      for (size_t i = 0; i < returns.size() && i < node->outputs().size();
           ++i) {
        const Value* v = node->output(i);
        if (!MayHoldTensor(v->type())) continue;
        if (EntersOrLeavesWildcard(returns[i].alias_info())) {
          members.push_back(v);
          containers.insert(containers.end(), read_containers.begin(),
                            read_containers.end());
          read_containers.clear();
        } else if (IsContainerHoldingTensors(v->type()) &&
                   returns[i].alias_info() != nullptr) {
          containers.push_back(v);  // views in a list (aten::split)
        }
      }
      if (containers.empty() || members.empty()) return;
      for (const Value* c : containers) {
        for (const Value* m : members) {
          classes.Union(AliasRoot(c), AliasRoot(m));
        }
      }
    });
  }
  return classes;
}

absl::flat_hash_set<const Value*> MutatedContainers(const Graph& graph) {
  absl::flat_hash_set<const Value*> out;
  for (const IrNode& ir : graph.nodes()) {
    ForEachWritten(ir.node, [&](const Value* v) {
      if (IsMutableContainer(v->type())) out.insert(AliasRoot(v));
    });
  }
  return out;
}

absl::flat_hash_set<const Value*> OpaqueRoots(const Graph& graph) {
  absl::flat_hash_set<const Value*> opaque;
  for (const Value* in : graph.graph()->inputs()) {
    if (IsContainerHoldingTensors(in->type())) opaque.insert(AliasRoot(in));
  }
  for (const IrNode& ir : graph.nodes()) {
    ForEachNested(ir.node, [&](const Node* node) {
      const c10::FunctionSchema* schema = node->maybeSchema();
      const bool plumbing = IsContainerPlumbing(node);
      for (size_t i = 0; i < node->outputs().size(); ++i) {
        const Value* v = node->output(i);
        if (!MayHoldTensor(v->type())) continue;
        const bool from_container =
            schema == nullptr
                ? plumbing
                : i < schema->returns().size() &&
                      EntersOrLeavesWildcard(schema->returns()[i].alias_info());
        if (IsContainerHoldingTensors(v->type()) || from_container) {
          opaque.insert(AliasRoot(v));
        }
      }
    });
  }
  return opaque;
}

absl::flat_hash_map<const Value*, std::vector<int>> ReadersByRoot(
    const Graph& graph) {
  absl::flat_hash_map<const Value*, std::vector<int>> readers_of_root;

  const ContainerClasses classes = ContainerAliasClasses(graph);
  const absl::flat_hash_set<const Value*> opaque = OpaqueRoots(graph);
  // Per root, the nodes reading it (through its aliases); per class, the
  // nodes reading any of its values, and those reading one that may be any
  // of its tensors (a container, or what came out of one).
  absl::flat_hash_map<const Value*, std::set<int>> direct;
  absl::flat_hash_map<const Value*, std::set<int>> readers_of_class;
  absl::flat_hash_map<const Value*, std::set<int>> opaque_readers_of_class;
  for (const IrNode& ir : graph.nodes()) {
    ForEachRead(ir.node, [&](const Value* v) {
      const Value* root = AliasRoot(v);
      const Value* cls = classes.Find(root);
      direct[root].insert(ir.id);
      readers_of_class[cls].insert(ir.id);
      if (opaque.count(root) != 0) opaque_readers_of_class[cls].insert(ir.id);
    });
  }
  // A container (or a value taken out of one) may be any tensor of its
  // class: every reader of the class reads it. A tensor that went into a
  // container is read by its own readers and by those of the class's
  // containers, not by the readers of the other tensors put there.
  auto readers = [&](const Value* root) {
    const Value* cls = classes.Find(root);
    std::set<int> out;
    if (opaque.count(root) != 0) {
      auto it = readers_of_class.find(cls);
      if (it != readers_of_class.end()) out = it->second;
    } else {
      if (auto it = direct.find(root); it != direct.end()) out = it->second;
      if (auto it = opaque_readers_of_class.find(cls);
          it != opaque_readers_of_class.end()) {
        out.insert(it->second.begin(), it->second.end());
      }
    }
    return std::vector<int>(out.begin(), out.end());
  };
  for (const IrNode& ir : graph.nodes()) {
    ForEachNested(ir.node, [&](const Node* node) {
      for (const Value* out : node->outputs()) {
        const Value* root = AliasRoot(out);
        if (readers_of_root.count(root) != 0) continue;
        std::vector<int> r = readers(root);
        if (!r.empty()) readers_of_root[root] = std::move(r);
      }
    });
  }
  for (const Value* in : graph.graph()->inputs()) {
    std::vector<int> r = readers(AliasRoot(in));
    if (!r.empty()) readers_of_root[AliasRoot(in)] = std::move(r);
  }
  return readers_of_root;
}

}  // namespace mutwo::worker
