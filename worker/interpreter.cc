#include "worker/interpreter.h"

#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/model_loader.h"

namespace mutwo::worker {
namespace {

using c10::IValue;
using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

// An error the interpreter raises itself (not an operator's).
class InterpreterError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The value of `value` in this run; an error naming it when it was never
// set (a graph the interpreter walks out of order).
IValue& Get(InterpreterEnv& env, const Value* value) {
  auto it = env.find(value);
  if (it == env.end()) {
    throw InterpreterError(
        absl::StrCat("value %", value->debugName(), " used before it was set"));
  }
  return it->second;
}

void SetOutputs(InterpreterEnv& env, const Node* node,
                std::vector<IValue> values) {
  for (size_t i = 0; i < node->outputs().size(); ++i) {
    env[node->outputs()[i]] = std::move(values[i]);
  }
}

// Drops the values defined inside `block` (one run of it), so that the next
// run of a loop body or a branch starts from what it reads from outside.
void ForgetBlock(InterpreterEnv& env, const Block* block) {
  for (const Value* param : block->inputs()) env.erase(param);
  for (const Node* inner : block->nodes()) {
    for (const Value* output : inner->outputs()) env.erase(output);
  }
}

// List, tuple and dict plumbing: no state of the interpreter, no operator.
// False when `node` is none of these.
bool RunContainerNode(Node* node, InterpreterEnv& env) {
  const c10::Symbol kind = node->kind();
  auto get = [&](const Value* value) -> IValue& { return Get(env, value); };
  auto set_outputs = [&](std::vector<IValue> values) {
    SetOutputs(env, node, std::move(values));
  };
  if (kind == c10::prim::ListConstruct) {
    auto list_type = node->output()->type()->expect<c10::ListType>();
    c10::impl::GenericList list(list_type->getElementType());
    list.reserve(node->inputs().size());
    for (const Value* value : node->inputs()) list.push_back(get(value));
    env[node->output()] = IValue(list);
  } else if (kind == c10::prim::TupleConstruct) {
    std::vector<IValue> elements;
    for (const Value* value : node->inputs()) elements.push_back(get(value));
    auto tuple_type = node->output()->type()->expect<c10::TupleType>();
    env[node->output()] =
        tuple_type->name().has_value()
            ? IValue(c10::ivalue::Tuple::createNamed(std::move(elements),
                                                     tuple_type))
            : IValue(c10::ivalue::Tuple::create(std::move(elements)));
  } else if (kind == c10::prim::TupleUnpack) {
    auto tuple = get(node->input(0)).toTuple();
    const auto& elements = tuple->elements();
    if (elements.size() != node->outputs().size()) {
      throw InterpreterError("tuple unpack: wrong number of elements");
    }
    std::vector<IValue> outputs(elements.begin(), elements.end());
    set_outputs(std::move(outputs));
  } else if (kind == c10::prim::TupleIndex) {
    auto tuple = get(node->input(0)).toTuple();
    int64_t index = get(node->input(1)).toInt();
    const int64_t size = static_cast<int64_t>(tuple->elements().size());
    if (index < 0) index += size;
    if (index < 0 || index >= size) {
      throw InterpreterError("tuple index out of range");
    }
    env[node->output()] = tuple->elements()[index];
  } else if (kind == c10::prim::ListUnpack) {
    auto list = get(node->input(0)).toList();
    if (list.size() != node->outputs().size()) {
      throw InterpreterError(absl::StrCat("expected a list of ",
                                          node->outputs().size(),
                                          " elements, got ", list.size()));
    }
    std::vector<IValue> outputs;
    for (size_t i = 0; i < list.size(); ++i) outputs.push_back(list.get(i));
    set_outputs(std::move(outputs));
  } else if (kind == c10::prim::DictConstruct) {
    auto dict_type = node->output()->type()->expect<c10::DictType>();
    c10::impl::GenericDict dict(dict_type->getKeyType(),
                                dict_type->getValueType());
    for (size_t i = 0; i + 1 < node->inputs().size(); i += 2) {
      dict.insert_or_assign(get(node->input(i)), get(node->input(i + 1)));
    }
    env[node->output()] = IValue(dict);
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::string ExceptionMessage(const std::exception& e) {
  return dynamic_cast<const c10::Error*>(&e) != nullptr
             ? FirstLine(static_cast<const c10::Error&>(e).msg())
             : FirstLine(e.what());
}

bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  return IsOutOfMemoryMessage(e.what());
}

Interpreter::Cached& Interpreter::CacheOf(const Node* node) {
  return cache_[node];
}

void Interpreter::RunBlock(Block* block, Env& env) {
  for (Node* node : block->nodes()) RunNode(node, env);
}

void Interpreter::RunNode(Node* node, Env& env) {
  const c10::Symbol kind = node->kind();
  running_ = node;
  if (kind == c10::prim::If) {
    RunIf(node, env);
  } else if (kind == c10::prim::Loop) {
    RunLoop(node, env);
  } else if (!RunContainerNode(node, env) && !RunInstruction(node, env)) {
    RunOperator(node, env);
  }
}

void Interpreter::RunIf(Node* node, Env& env) {
  auto get = [&](const Value* value) -> IValue& { return Get(env, value); };
  const bool then_branch = get(node->input(0)).toBool();
  if (hooks_ != nullptr && hooks_->on_branch) {
    hooks_->on_branch(node, then_branch);
  }
  Block* block = node->blocks()[then_branch ? 0 : 1];
  RunBlock(block, env);
  std::vector<IValue> outputs;
  for (const Value* value : block->outputs()) outputs.push_back(get(value));
  ForgetBlock(env, block);
  SetOutputs(env, node, std::move(outputs));
}

void Interpreter::RunLoop(Node* node, Env& env) {
  auto get = [&](const Value* value) -> IValue& { return Get(env, value); };
  Block* body = node->blocks()[0];
  const int64_t max_trips = get(node->input(0)).toInt();
  bool cond = get(node->input(1)).toBool();
  std::vector<IValue> carried;
  for (size_t i = 2; i < node->inputs().size(); ++i) {
    carried.push_back(get(node->input(i)));
  }
  for (int64_t trip = 0; cond && trip < max_trips; ++trip) {
    env[body->inputs()[0]] = IValue(trip);
    for (size_t i = 0; i < carried.size(); ++i) {
      env[body->inputs()[i + 1]] = carried[i];
    }
    RunBlock(body, env);
    cond = get(body->outputs()[0]).toBool();
    for (size_t i = 0; i < carried.size(); ++i) {
      carried[i] = get(body->outputs()[i + 1]);
    }
    ForgetBlock(env, body);
  }
  SetOutputs(env, node, std::move(carried));
}

bool Interpreter::RunInstruction(Node* node, Env& env) {
  const c10::Symbol kind = node->kind();
  auto get = [&](const Value* value) -> IValue& { return Get(env, value); };
  if (kind == c10::prim::Constant) {
    // The same value each run, as TorchScript's constant table gives.
    Cached& cached = CacheOf(node);
    if (!cached.has_constant) {
      auto value = torch::jit::toIValue(node->output());
      cached.constant = value.has_value() ? *value : IValue();
      cached.has_constant = true;
    }
    env[node->output()] = cached.constant;
  } else if (kind == c10::prim::GetAttr) {
    const auto& object = get(node->input(0)).toObject();
    Cached& cached = CacheOf(node);
    if (cached.attribute_type != object->type()) {
      cached.attribute_type = object->type();
      cached.slot = object->type()->getAttributeSlot(node->s(c10::attr::name));
    }
    env[node->output()] = object->getSlot(cached.slot);
  } else if (kind == c10::prim::SetAttr) {
    get(node->input(0))
        .toObject()
        ->setAttr(node->s(c10::attr::name), get(node->input(1)));
  } else if (kind == c10::prim::RaiseException) {
    const IValue& message = get(node->input(0));
    throw InterpreterError(absl::StrCat(
        "the model raised: ",
        message.isString() ? message.toStringRef() : std::string("exception")));
  } else if (kind == c10::aten::warn) {
    // An interpreter instruction in TorchScript (no operator): warns once
    // per node, as TorchScript's WARN does.
    if (warned_.insert(node).second) {
      const IValue& message = get(node->input(0));
      TORCH_WARN(message.isString() ? message.toStringRef()
                                    : std::string("warning"));
    }
  } else if (kind == c10::prim::isinstance) {
    const c10::TypePtr type = get(node->input(0)).type();
    bool matches = false;
    for (const c10::TypePtr& candidate : node->tys(c10::attr::types)) {
      matches |= type->isSubtypeOf(*candidate);
    }
    env[node->output()] = IValue(matches);
  } else if (kind == c10::prim::Uninitialized) {
    env[node->output()] = IValue();
  } else if (kind == c10::prim::unchecked_cast) {
    env[node->output()] = get(node->input(0));
  } else if (kind == c10::prim::CallMethod || kind == c10::prim::CallFunction) {
    throw InterpreterError(
        absl::StrCat("unsupported node ", kind.toQualString(),
                     " left after inlining (interface or dynamic call)"));
  } else {
    return false;
  }
  return true;
}

void Interpreter::RunOperator(Node* node, Env& env) {
  const c10::Symbol kind = node->kind();
  auto get = [&](const Value* value) -> IValue& { return Get(env, value); };
  torch::jit::Stack stack;
  stack.reserve(node->inputs().size());
  for (const Value* value : node->inputs()) stack.push_back(get(value));
  // Vararg operators (aten::format, prim::Print) take the number of
  // inputs on top of the stack, as TorchScript's OPN instruction does.
  const c10::FunctionSchema* schema = node->maybeSchema();
  if (schema != nullptr && schema->is_vararg()) {
    stack.emplace_back(static_cast<int64_t>(node->inputs().size()));
  }
  Cached& cached = CacheOf(node);
  if (!cached.op.has_value()) cached.op.emplace(node->getOperation());
  (*cached.op)(stack);
  if (stack.size() < node->outputs().size()) {
    throw InterpreterError(absl::StrCat(kind.toQualString(), " returned ",
                                        stack.size(), " values, expected ",
                                        node->outputs().size()));
  }
  const size_t first = stack.size() - node->outputs().size();
  std::vector<IValue> outputs(std::make_move_iterator(stack.begin() + first),
                              std::make_move_iterator(stack.end()));
  SetOutputs(env, node, std::move(outputs));
}

void Interpreter::RunRange(int first, int last, Env& env) {
  for (int id = first; id <= last; ++id) {
    const IrNode& ir = graph_->nodes()[id];
    RunNode(ir.node, env);
    for (const Value* value : ir.dead_after) env.erase(value);
  }
}

absl::StatusOr<c10::IValue> Interpreter::Run(
    const torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
    const InterpreterHooks& hooks) {
  failed_node_ = -1;
  const auto& graph = graph_->graph();
  if (static_cast<int>(inputs.size()) != graph_->num_inputs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward takes ", graph_->num_inputs(), " inputs, got ",
                     inputs.size(), " (one --input per forward argument)"));
  }
  Env env;
  env[graph->inputs()[0]] = module._ivalue();
  for (size_t i = 0; i < inputs.size(); ++i) {
    env[graph->inputs()[i + 1]] = inputs[i];
  }
  int current = -1;
  running_ = nullptr;
  hooks_ = &hooks;
  // Cleared however Run ends (RunRange outside a Run reports no branches).
  struct ClearHooks {
    const InterpreterHooks** hooks;
    ~ClearHooks() { *hooks = nullptr; }
  } clear_hooks{&hooks_};
  try {
    const int n = graph_->num_nodes();
    for (int id = 0; id < n; ++id) {
      const IrNode& ir = graph_->nodes()[id];
      current = ir.id;
      if (hooks.take_over) {
        const int last = hooks.take_over(id, env);
        if (last >= id) {
          for (int k = id; k <= last; ++k) {
            for (const Value* value : graph_->nodes()[k].dead_after) {
              env.erase(value);
            }
          }
          id = last;
          continue;
        }
      }
      if (hooks.before_node) hooks.before_node(ir.id);
      RunNode(ir.node, env);
      if (hooks.after_node) {
        std::vector<IValue> outputs;
        outputs.reserve(ir.node->outputs().size());
        for (const Value* value : ir.node->outputs()) {
          outputs.push_back(env[value]);
        }
        hooks.after_node(ir.id, outputs);
        for (size_t i = 0; i < outputs.size(); ++i) {
          env[ir.node->outputs()[i]] = std::move(outputs[i]);
        }
      }
      for (const Value* value : ir.dead_after) env.erase(value);
    }
    current = -1;
    c10::IValue result = env.at(graph->outputs()[0]);
    return result;
  } catch (const std::exception& e) {
    failed_node_ = current;
    std::string where = current >= 0
                            ? absl::StrCat("node ", graph_->Describe(current))
                            : std::string("forward");
    if (current >= 0 && running_ != nullptr &&
        running_ != graph_->nodes()[current].node) {
      absl::StrAppend(&where, " in ", running_->kind().toQualString());
    }
    const std::string what = ExceptionMessage(e);
    if (IsOutOfMemory(e)) {
      return absl::ResourceExhaustedError(absl::StrCat(where, ": ", what));
    }
    if (dynamic_cast<const InterpreterError*>(&e) != nullptr &&
        !absl::StartsWith(what, "the model raised")) {
      return absl::InternalError(absl::StrCat(where, ": ", what));
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  }
}

}  // namespace mutwo::worker
