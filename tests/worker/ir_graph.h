// A worker Graph from IR text (torch::jit::parseIR, as PyTorch's JIT pass
// tests build theirs), for unit tests of what runs over the IR: the
// schedule compiler (execution_plan.h) and the segment runs
// (checkpoint.h). The graph's first input is `self`; it gets the type of a
// module the test owns, so that prim::GetAttr reads that module's
// parameters and buffers when the interpreter runs the graph. Tensor
// constants (`%c : Float(device=cpu) = prim::Constant[value={0.5}]()`, the
// type naming dtype and sizes) are parsed as tensors of the
// right shape with no set values: a test fills them (TensorConstant).
#ifndef MUTWO_TESTS_WORKER_IR_GRAPH_H_
#define MUTWO_TESTS_WORKER_IR_GRAPH_H_

#include <gtest/gtest.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/script.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mutwo/v1/types.pb.h"
#include "worker/graph.h"

namespace mutwo::testing {

struct IrGraph {
  // Parses `ir` over `module` (its `self`: the first graph input).
  IrGraph(const std::string& ir, torch::jit::Module module_in)
      : module(std::move(module_in)) {
    auto parsed = std::make_shared<torch::jit::Graph>();
    torch::jit::parseIR(ir, parsed.get(), values,
                        /*parse_tensor_constants=*/true);
    parsed->inputs()[0]->setType(module.type());
    auto created = worker::Graph::Create(module, parsed);
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) graph = *std::move(created);
  }
  explicit IrGraph(const std::string& ir)
      : IrGraph(ir, torch::jit::Module(c10::QualifiedName("IrGraphModule"))) {}

  // The value named `%name` in the IR text.
  const torch::jit::Value* value(const std::string& name) const {
    auto it = values.find(name);
    EXPECT_NE(it, values.end()) << "no value %" << name;
    return it == values.end() ? nullptr : it->second;
  }
  // The tensor the prim::Constant defining `%name` holds (every run of the
  // node returns this tensor).
  torch::Tensor TensorConstant(const std::string& name) const {
    const torch::jit::Value* v = value(name);
    return v == nullptr ? torch::Tensor() : v->node()->t(c10::attr::value);
  }
  // The node id of the node defining `%name`.
  int id(const std::string& name) const {
    return graph->ProducerOf(value(name));
  }

  torch::jit::Module module;
  std::unique_ptr<worker::Graph> graph;
  std::unordered_map<std::string, torch::jit::Value*> values;
};

// A RECOMPUTE decision of `segment` for the node defining `producer`, to be
// rebuilt from the nodes defining `from` (the producer included).
inline void AddRecompute(const IrGraph& g, v1::Schedule* schedule,
                         const std::string& producer,
                         const std::vector<std::string>& from,
                         int segment = 0) {
  v1::Decision* d = schedule->add_decisions();
  d->set_value_id(schedule->decisions_size());
  d->set_action(v1::Decision::RECOMPUTE);
  d->set_producer_node(g.id(producer));
  d->set_segment(segment);
  for (const std::string& name : from) d->add_recompute_nodes(g.id(name));
}

// A RETAIN decision: the node defining `producer` holds an activation.
inline void AddRetain(const IrGraph& g, v1::Schedule* schedule,
                      const std::string& producer) {
  v1::Decision* d = schedule->add_decisions();
  d->set_value_id(schedule->decisions_size());
  d->set_action(v1::Decision::RETAIN);
  d->set_producer_node(g.id(producer));
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_WORKER_IR_GRAPH_H_
