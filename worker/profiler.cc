#include "worker/profiler.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "worker/activation_analysis.h"
#include "worker/alias.h"
#include "worker/autograd_hooks.h"
#include "worker/graph.h"
#include "worker/inputs.h"
#include "worker/interpreter.h"
#include "worker/memory.h"
#include "worker/model_loader.h"
#include "worker/profiler_records.h"
#include "worker/replay_probe.h"
#include "worker/training_setup.h"

namespace mutwo::worker {
namespace {

using torch::autograd::Node;

// Every autograd node reachable from `root`, in discovery order.
std::vector<Node*> ReachableFrom(Node* root) {
  std::vector<Node*> order;
  if (root == nullptr) return order;
  absl::flat_hash_set<Node*> seen{root};
  std::vector<Node*> stack{root};
  while (!stack.empty()) {
    Node* fn = stack.back();
    stack.pop_back();
    order.push_back(fn);
    for (const auto& edge : fn->next_edges()) {
      Node* next = edge.function.get();
      if (next != nullptr && seen.insert(next).second) stack.push_back(next);
    }
  }
  return order;
}

// Bytes of the storages a node's outputs own (an output aliasing an input
// owns none).
int64_t OwnedOutputBytes(const Graph& graph, int id,
                         const std::vector<c10::IValue>& outputs) {
  int64_t owned = 0;
  absl::flat_hash_set<const void*> seen;
  const auto& values = graph.nodes()[id].node->outputs();
  for (size_t i = 0; i < outputs.size() && i < values.size(); ++i) {
    if (AliasRoot(values[i]) != values[i]) continue;
    for (const torch::Tensor& t : FlattenTensors(outputs[i])) {
      if (t.defined() && t.has_storage() &&
          seen.insert(t.storage().data()).second) {
        owned += static_cast<int64_t>(t.storage().nbytes());
      }
    }
  }
  return owned;
}

// The median over the iterations of one of their figures.
double MedianOf(const std::vector<IterationRecord>& records,
                double IterationRecord::*field) {
  std::vector<double> values;
  values.reserve(records.size());
  for (const auto& r : records) values.push_back(r.*field);
  return Median(values);
}

// Autograd node -> the IR node that created it, held weakly (see
// InterpretedStep).
using NodeOwners =
    absl::flat_hash_map<Node*, std::pair<std::weak_ptr<Node>, int>>;

}  // namespace

struct Profiler::State : TrainingState {
  ProfilerOptions options;

  absl::StatusOr<torch::Tensor> Loss(const c10::IValue& outputs) {
    return ComputeLoss(options.loss, outputs, targets);
  }

  absl::Status CheckCorrectness(v1::Profile* profile);
  // TrainingState::TimedSteps of `forward` + loss + backward, errors
  // named `what`.
  absl::Status TimedSteps(
      const std::string& what,
      const std::function<absl::StatusOr<c10::IValue>()>& forward, double* ms,
      int64_t* peak);
  absl::Status MeasureModuleStep(v1::Profile* profile);
  absl::Status InterpretedStep(IterationRecord* record);
  // One hook pair per autograd node of `functions`: a StepRecord per
  // backward step, named and tied to the forward node that made it.
  void HookBackwardSteps(const std::vector<Node*>& functions,
                         const NodeOwners& owner, PeakWindows& windows,
                         IterationRecord* record);
  // Median time of the interpreted step with no instrumentation (the step
  // the executor runs without a schedule), after its own warm-up.
  absl::StatusOr<double> CleanStepMs();
  void Fill(const std::vector<IterationRecord>& records, v1::Profile* profile);
  // Fill's parts. Per node, its edges for the activation analysis and, in
  // `reads_mutated`, a list or dict it reads that a node writes in place.
  std::vector<LineageNode> LineageNodes(
      std::vector<std::string>* reads_mutated);
  // The profile's measured step and its other fixed bytes.
  void FillMeasured(const std::vector<IterationRecord>& records,
                    const ActivationAnalysis& analysis, v1::Profile* profile);
};

absl::Status Profiler::State::CheckCorrectness(v1::Profile* profile) {
  // Loss and gradients of one step with a fixed seed (dropout draws the same
  // masks). The interpreter runs first: its errors name the failing node.
  auto step = [&](bool interpreted, double* loss_value,
                  std::vector<torch::Tensor>* grads) -> absl::Status {
    ZeroGrads();
    torch::manual_seed(options.seed + 1);
    c10::IValue outputs;
    if (interpreted) {
      current_step = "interpreter forward (correctness check)";
      MUTWO_ASSIGN_OR_RETURN(outputs, interpreter->Run(module, inputs));
    }
    return Guard(
        interpreted ? "interpreter backward" : "module forward/backward",
        [&]() -> absl::Status {
          current_step = interpreted
                             ? "interpreter backward (correctness check)"
                             : "module step (correctness check)";
          if (!interpreted) outputs = module.forward(inputs);
          MUTWO_ASSIGN_OR_RETURN(torch::Tensor loss, Loss(outputs));
          if (!loss.requires_grad()) {
            return absl::InvalidArgumentError(
                "the loss does not depend on any trainable parameter");
          }
          outputs = c10::IValue();
          loss.backward();
          *loss_value = loss.item<double>();
          for (const torch::Tensor& p : parameters) {
            grads->push_back(p.grad().defined()
                                 ? p.grad().to(torch::kFloat64)
                                 : torch::zeros_like(p, torch::kFloat64));
          }
          ZeroGrads();
          return absl::OkStatus();
        });
  };
  double interpreter_loss = 0, module_loss = 0;
  std::vector<torch::Tensor> interpreter_grads, module_grads;
  MUTWO_RETURN_IF_ERROR(step(true, &interpreter_loss, &interpreter_grads));
  // The reference runs the unoptimized graph, so that the comparison is
  // exact (the graph executor may otherwise fuse or reorder on GPU).
  const bool optimize = torch::jit::getGraphExecutorOptimize();
  torch::jit::setGraphExecutorOptimize(false);
  absl::Status status = step(false, &module_loss, &module_grads);
  torch::jit::setGraphExecutorOptimize(optimize);
  MUTWO_RETURN_IF_ERROR(status);
  double max_diff = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (module_grads[i].numel() == 0) continue;
    max_diff = std::max(
        max_diff,
        (interpreter_grads[i] - module_grads[i]).abs().max().item<double>());
  }
  profile->set_max_abs_grad_diff(max_diff);
  profile->set_loss_matches_module(std::abs(interpreter_loss - module_loss) <=
                                   1e-6 * std::max(1.0, std::abs(module_loss)));
  return absl::OkStatus();
}

absl::Status Profiler::State::TimedSteps(
    const std::string& what,
    const std::function<absl::StatusOr<c10::IValue>()>& forward, double* ms,
    int64_t* peak) {
  return TrainingState::TimedSteps(
      options.warmup_iterations, options.measure_iterations,
      [&]() {
        current_step = what;
        return Guard(current_step, [&]() -> absl::Status {
          MUTWO_ASSIGN_OR_RETURN(c10::IValue outputs, forward());
          MUTWO_ASSIGN_OR_RETURN(torch::Tensor loss, Loss(outputs));
          outputs = c10::IValue();
          loss.backward();
          return absl::OkStatus();
        });
      },
      ms, peak);
}

absl::Status Profiler::State::MeasureModuleStep(v1::Profile* profile) {
  double ms = 0;
  int64_t peak = 0;
  MUTWO_RETURN_IF_ERROR(TimedSteps(
      "module training step",
      [&]() -> absl::StatusOr<c10::IValue> { return module.forward(inputs); },
      &ms, &peak));
  profile->mutable_measured()->set_module_peak_bytes(peak);
  profile->mutable_measured()->set_module_iteration_ms(ms);
  return absl::OkStatus();
}

absl::StatusOr<double> Profiler::State::CleanStepMs() {
  double ms = 0;
  int64_t peak = 0;
  MUTWO_RETURN_IF_ERROR(TimedSteps(
      "timing step", [&]() { return interpreter->Run(module, inputs); }, &ms,
      &peak));
  return ms;
}

namespace {

// The instrumented step (a mark and an allocator query around every node,
// a hook pair on every backward node) runs slower than the step the
// executor runs; its per-node times are scaled so that they sum to the
// clean step's time, which becomes the profile's iteration time. The
// planner predicts from these (a 224-px Swin-T's instrumented step took
// 98 ms on an H100, the executor's own 57.5 ms).
void ScaleTimes(double clean_ms, v1::Profile* profile) {
  v1::MeasuredStep* m = profile->mutable_measured();
  double parts = m->loss_ms() + m->optimizer_ms();
  for (const v1::ProfileNode& node : profile->nodes()) {
    parts += node.forward_ms();
  }
  for (const v1::BackwardStep& step : profile->backward_steps()) {
    parts += step.ms();
  }
  if (!(clean_ms > 0) || !(parts > 0)) return;
  const double f = clean_ms / parts;
  for (v1::ProfileNode& node : *profile->mutable_nodes()) {
    node.set_forward_ms(node.forward_ms() * f);
    node.set_backward_ms(node.backward_ms() * f);
  }
  for (v1::BackwardStep& step : *profile->mutable_backward_steps()) {
    step.set_ms(step.ms() * f);
  }
  for (v1::Activation& a : *profile->mutable_activations()) {
    a.set_recompute_ms(a.recompute_ms() * f);
  }
  m->set_forward_ms(m->forward_ms() * f);
  m->set_backward_ms(m->backward_ms() * f);
  m->set_loss_ms(m->loss_ms() * f);
  m->set_optimizer_ms(m->optimizer_ms() * f);
  m->set_instrumented_iteration_ms(m->iteration_ms());
  m->set_iteration_ms(clean_ms);
}

}  // namespace

absl::Status Profiler::State::InterpretedStep(IterationRecord* record) {
  const int n = graph->num_nodes();
  record->node_ms.assign(n, 0);
  record->node_host_ms.assign(n, 0);
  record->node_allocated_after.assign(n, 0);
  record->node_peak.assign(n, 0);
  record->node_before.assign(n, 0);
  record->node_transient.assign(n, 0);
  record->output_storages.assign(n, {});
  record->output_indices.assign(n, {});
  record->outputs_alive.assign(n, true);
  std::vector<int> node_start(n, 0), node_end(n, 0);
  std::vector<std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>> weak(n);
  // Autograd node -> IR node that created it (found when its outputs
  // appear). Keyed by address, so each entry keeps a weak reference: a node
  // that died in forward and whose address a later node got must not lend
  // the later one its owner (which IR node made a backward step then
  // depended on the allocator: lstm_lm's first_backward_use was 81 in
  // one profile and 90 in another).
  NodeOwners owner;
  auto claim = [&owner](Node* fn, int id) {
    auto [it, added] = owner.try_emplace(fn, fn->shared_from_this(), id);
    if (!added && it->second.first.expired()) {
      it->second = {fn->shared_from_this(), id};
    }
  };

  ZeroGrads();
  backend->Synchronize();
  backend->ClearMarks();
  backend->SetTag(kIdleTag);
  PeakWindows windows(backend.get());
  windows.Open(nullptr);
  record->start_bytes = backend->AllocatedBytes();
  const int iteration_start = backend->Mark();

  InterpreterHooks hooks;
  std::chrono::steady_clock::time_point host_start;
  hooks.before_node = [&](int id) {
    windows.Open([record, id](int64_t peak) { record->node_peak[id] = peak; });
    record->node_before[id] = backend->AllocatedBytes();
    backend->SetTag(id);
    current_step = absl::StrCat("forward node ", graph->Describe(id));
    node_start[id] = backend->Mark();
    host_start = std::chrono::steady_clock::now();
  };
  hooks.after_node = [&](int id, std::vector<c10::IValue>& outputs) {
    record->node_host_ms[id] =
        std::chrono::duration<double, std::milli>(
            std::chrono::steady_clock::now() - host_start)
            .count();
    node_end[id] = backend->Mark();
    record->node_allocated_after[id] = backend->AllocatedBytes();
    const int64_t owned = OwnedOutputBytes(*graph, id, outputs);
    record->node_transient[id] = std::max<int64_t>(
        0, backend->PeakBytes() - std::max(record->node_before[id] + owned,
                                           record->node_allocated_after[id]));
    for (size_t index = 0; index < outputs.size(); ++index) {
      for (const torch::Tensor& t : FlattenTensors(outputs[index])) {
        if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) {
          continue;
        }
        weak[id].push_back(t.storage().getWeakStorageImpl());
        record->output_storages[id].push_back(
            reinterpret_cast<uintptr_t>(t.storage().data()));
        record->output_indices[id].push_back(static_cast<int>(index));
        if (!t.requires_grad()) continue;
        for (Node* fn : ReachableFrom(t.grad_fn().get())) claim(fn, id);
      }
    }
  };

  torch::Tensor loss;
  {
    absl::StatusOr<c10::IValue> outputs =
        interpreter->Run(module, inputs, hooks);
    if (!outputs.ok()) return outputs.status();
    const int forward_end = backend->Mark();
    windows.Open([record](int64_t p) { record->loss_peak_bytes = p; });
    backend->SetTag(kLossTag);
    current_step = "loss";
    MUTWO_RETURN_IF_ERROR(Guard(current_step, [&]() {
      MUTWO_ASSIGN_OR_RETURN(loss, Loss(*outputs));
      return absl::OkStatus();
    }));
    const int loss_end = backend->Mark();
    backend->Synchronize();
    record->forward_ms = backend->ElapsedMs(iteration_start, forward_end);
    record->loss_ms = backend->ElapsedMs(forward_end, loss_end);
  }
  // The interpreter and the outputs are gone: what is alive now is held by
  // autograd (or is fixed memory).
  record->end_of_forward_bytes = backend->AllocatedBytes();
  record->live_at_end_of_forward = backend->LiveBlocks();
  for (int id = 0; id < n; ++id) {
    for (const auto& ref : weak[id]) {
      if (ref.expired()) record->outputs_alive[id] = false;
    }
  }
  weak.clear();

  // Backward, one hook pair per autograd node.
  std::vector<Node*> functions = ReachableFrom(loss.grad_fn().get());
  HookBackwardSteps(functions, owner, windows, record);
  backend->StartFreeLog();
  current_step = "backward";
  const int backward_start = backend->Mark();
  absl::Status backward = Guard("backward", [&]() {
    loss.backward();
    return absl::OkStatus();
  });
  const int backward_end = backend->Mark();
  windows.Close();
  loss = torch::Tensor();  // releases what is left of the graph
  functions.clear();
  record->frees = backend->StopFreeLog();
  backend->SetTag(kIdleTag);
  if (!backward.ok()) {
    if (absl::IsResourceExhausted(backward) && !record->steps.empty()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(current_step, ": ", backward.message()));
    }
    return backward;
  }

  windows.Open([record](int64_t p) { record->optimizer_peak_bytes = p; });
  const int optimizer_start = backend->Mark();
  MUTWO_RETURN_IF_ERROR(OptimizerStep());
  const int iteration_end = backend->Mark();
  windows.Close();
  backend->Synchronize();

  for (int id = 0; id < n; ++id) {
    record->node_ms[id] = backend->ElapsedMs(node_start[id], node_end[id]);
  }
  for (StepRecord& step : record->steps) {
    step.ms = backend->ElapsedMs(step.start_mark, step.end_mark);
  }
  record->backward_ms = backend->ElapsedMs(backward_start, backward_end);
  record->optimizer_ms = backend->ElapsedMs(optimizer_start, iteration_end);
  record->iteration_ms = backend->ElapsedMs(iteration_start, iteration_end);
  record->peak_bytes = windows.step_peak();
  return absl::OkStatus();
}

void Profiler::State::HookBackwardSteps(const std::vector<Node*>& functions,
                                        const NodeOwners& owner,
                                        PeakWindows& windows,
                                        IterationRecord* record) {
  const int n = graph->num_nodes();
  record->steps.reserve(functions.size());
  for (Node* fn : functions) {
    auto it = owner.find(fn);
    const int forward_node = it == owner.end() || it->second.first.expired()
                                 ? -1
                                 : it->second.second;
    fn->add_pre_hook(std::make_unique<CallbackPreHook>([this, record, &windows,
                                                        n, fn, forward_node]() {
      const int k = static_cast<int>(record->steps.size());
      windows.Open([record, k](int64_t peak) { record->steps[k].peak = peak; });
      backend->SetTag(n + k);
      StepRecord step;
      step.name = fn->name();
      step.forward_node = forward_node;
      current_step = absl::StrCat("backward step ", k, " (", step.name, ")");
      step.start_mark = backend->Mark();
      record->steps.push_back(std::move(step));
    }));
    fn->add_post_hook(std::make_unique<CallbackPostHook>([this, record]() {
      StepRecord& step = record->steps.back();
      step.end_mark = backend->Mark();
      step.allocated_after = backend->AllocatedBytes();
    }));
  }
}

std::vector<LineageNode> Profiler::State::LineageNodes(
    std::vector<std::string>* reads_mutated) {
  const int n = graph->num_nodes();
  reads_mutated->assign(n, "");
  std::vector<LineageNode> lineage_nodes(n);
  const auto mutated = MutatedContainers(*graph);
  for (const IrNode& ir : graph->nodes()) {
    ForEachRead(ir.node, [&](const torch::jit::Value* v) {
      const torch::jit::Value* root = AliasRoot(v);
      if ((*reads_mutated)[ir.id].empty() && mutated.count(root) != 0 &&
          !DefinedWithin(root, ir.node)) {
        (*reads_mutated)[ir.id] = v->debugName();
      }
    });
    LineageNode& node = lineage_nodes[ir.id];
    node.input_nodes = ir.input_nodes;
    node.consumers = ir.consumers;
    node.last_use = ir.last_use;
    node.writes_in_place = WritesInPlace(ir.node);
    node.reads_mutated_container = !(*reads_mutated)[ir.id].empty();
  }
  return lineage_nodes;
}

void Profiler::State::FillMeasured(const std::vector<IterationRecord>& records,
                                   const ActivationAnalysis& analysis,
                                   v1::Profile* profile) {
  const IterationRecord& last = records.back();
  v1::MeasuredStep* measured = profile->mutable_measured();
  int64_t peak = 0;
  for (const auto& r : records) peak = std::max(peak, r.peak_bytes);
  measured->set_peak_bytes(peak);
  int64_t loss_peak = 0, optimizer_peak = 0;
  for (const auto& r : records) {
    loss_peak = std::max(loss_peak, r.loss_peak_bytes);
    optimizer_peak = std::max(optimizer_peak, r.optimizer_peak_bytes);
  }
  measured->set_loss_peak_bytes(loss_peak);
  measured->set_optimizer_peak_bytes(optimizer_peak);
  measured->set_iteration_ms(MedianOf(records, &IterationRecord::iteration_ms));
  measured->set_forward_ms(MedianOf(records, &IterationRecord::forward_ms));
  measured->set_loss_ms(MedianOf(records, &IterationRecord::loss_ms));
  measured->set_backward_ms(MedianOf(records, &IterationRecord::backward_ms));
  measured->set_optimizer_ms(MedianOf(records, &IterationRecord::optimizer_ms));
  measured->set_tracked_activation_bytes(analysis.tracked_bytes);
  measured->set_end_of_forward_bytes(last.end_of_forward_bytes);
  measured->set_loss_bytes(analysis.loss_bytes);
  // What the process held when the step began beyond the named categories
  // (e.g. archive records LibTorch keeps for the loaded model's code).
  v1::FixedMemory* fixed = profile->mutable_fixed();
  const int64_t named = fixed->parameter_bytes() + fixed->buffer_bytes() +
                        fixed->optimizer_state_bytes() + fixed->input_bytes();
  fixed->set_other_bytes(std::max<int64_t>(0, last.start_bytes - named));
}

void Profiler::State::Fill(const std::vector<IterationRecord>& records,
                           v1::Profile* profile) {
  const IterationRecord& last = records.back();
  const int n = graph->num_nodes();
  const int num_steps = static_cast<int>(last.steps.size());

  // Medians over the iterations (backward steps: over the iterations whose
  // step sequence is the last one's; data-dependent control flow may differ).
  std::vector<double> node_ms(n);
  std::vector<double> node_host_ms(n, 0);
  const bool separate_host = device.is_cuda();
  for (int id = 0; id < n; ++id) {
    std::vector<double> values;
    values.reserve(records.size());
    for (const auto& r : records) values.push_back(r.node_ms[id]);
    node_ms[id] = Median(values);
    if (!separate_host) continue;
    values.clear();
    for (const auto& r : records) values.push_back(r.node_host_ms[id]);
    node_host_ms[id] = Median(values);
  }
  std::vector<double> step_ms(num_steps);
  for (int k = 0; k < num_steps; ++k) {
    std::vector<double> values;
    for (const auto& r : records) {
      if (r.steps.size() != last.steps.size()) continue;
      bool same = true;
      for (int j = 0; j < num_steps && same; ++j) {
        same = r.steps[j].name == last.steps[j].name;
      }
      if (same) values.push_back(r.steps[k].ms);
    }
    step_ms[k] = Median(values);
  }

  std::vector<double> node_backward_ms(n, 0);
  for (int k = 0; k < num_steps; ++k) {
    const StepRecord& step = last.steps[k];
    if (step.forward_node >= 0) {
      node_backward_ms[step.forward_node] += step_ms[k];
    }
    v1::BackwardStep* out = profile->add_backward_steps();
    out->set_index(k);
    out->set_name(step.name);
    out->set_forward_node(step.forward_node);
    out->set_ms(step_ms[k]);
    out->set_allocated_bytes_after(step.allocated_after);
    out->set_peak_bytes_during(step.peak);
  }
  for (const IrNode& ir : graph->nodes()) {
    v1::ProfileNode* node = profile->mutable_nodes(ir.id);
    node->set_forward_ms(node_ms[ir.id]);
    node->set_host_ms(node_host_ms[ir.id]);
    node->set_backward_ms(node_backward_ms[ir.id]);
    node->set_allocated_bytes_after(last.node_allocated_after[ir.id]);
    node->set_peak_bytes_during(last.node_peak[ir.id]);
    node->set_transient_bytes(last.node_transient[ir.id]);
  }

  // Forward time from after position p to the end of forward (+ loss), and
  // backward time before step k.
  std::vector<double> forward_after(n + 1, 0);
  for (int id = n - 1; id >= 0; --id) {
    forward_after[id] = forward_after[id + 1] + node_ms[id];
  }
  const double loss_ms = MedianOf(records, &IterationRecord::loss_ms);
  std::vector<double> backward_before(num_steps + 1, 0);
  for (int k = 0; k < num_steps; ++k) {
    backward_before[k + 1] = backward_before[k] + step_ms[k];
  }
  const double h2d = profile->device().host_to_device_bytes_per_second();
  const double d2h = profile->device().device_to_host_bytes_per_second();

  // Liveness and recompute lineage of the activations (activation_analysis.h)
  // over what the last measured step recorded. Per node: a list or dict it
  // reads that some node writes in place (a DenseNet block's `features`): a
  // replay of it would read the container as it is when the replay runs,
  // not as it was in forward. A container the node makes itself, in its
  // own blocks (the bool list of nn.TransformerEncoderLayer's fast-path
  // check), is made again by the replay: not a reason.
  std::vector<std::string> reads_mutated;
  const std::vector<LineageNode> lineage_nodes = LineageNodes(&reads_mutated);
  StepMemoryRecord memory;
  memory.live_at_end_of_forward = last.live_at_end_of_forward;
  memory.frees = last.frees;
  memory.output_storages = last.output_storages;
  memory.output_indices = last.output_indices;
  memory.outputs_alive = last.outputs_alive;
  for (const StepRecord& step : last.steps) {
    memory.step_forward_node.push_back(step.forward_node);
  }
  const ActivationAnalysis analysis = AnalyzeActivations(lineage_nodes, memory);
  for (const ActivationRecord& record : analysis.activations) {
    v1::Activation* a = profile->add_activations();
    a->set_value_id(record.value_id);
    a->set_producer_node(record.producer_node);
    a->set_size_bytes(record.size_bytes);
    a->set_unswappable_bytes(record.unswappable_bytes);
    a->set_storages(record.storages);
    for (int index : record.output_indices) a->add_output_indices(index);
    a->set_last_forward_use(record.last_forward_use);
    a->set_first_backward_use(record.first_backward_use);
    a->set_last_backward_use(record.last_backward_use);
    a->set_inactive_ms(forward_after[record.last_forward_use + 1] + loss_ms +
                       backward_before[record.first_backward_use - n]);
    if (h2d > 0 && d2h > 0) {
      const double size = static_cast<double>(record.size_bytes);
      a->set_swap_ms(1000.0 * (size / h2d + size / d2h));
    }
    double ms = 0;
    for (int id : record.recompute_nodes) {
      a->add_recompute_nodes(id);
      ms += node_ms[id];
    }
    if (record.mutated_container_reader >= 0) {
      const int id = record.mutated_container_reader;
      a->set_not_recomputable(
          absl::StrCat("its replay would run node ", graph->Describe(id),
                       ", which reads the list or dict %", reads_mutated[id],
                       " that the graph writes in place"));
    }
    for (int source : record.recompute_sources) {
      a->add_recompute_sources(source);
    }
    a->set_recompute_ms(ms);
  }

  FillMeasured(records, analysis, profile);
}

Profiler::Profiler(std::unique_ptr<State> state) : state_(std::move(state)) {}
Profiler::~Profiler() = default;

const std::string& Profiler::graph_fingerprint() const {
  return state_->graph->fingerprint();
}
int Profiler::num_nodes() const { return state_->graph->num_nodes(); }

absl::StatusOr<std::unique_ptr<Profiler>> Profiler::Create(
    ProfilerOptions options) {
  auto state = std::make_unique<State>();
  MUTWO_RETURN_IF_ERROR(SetUpTraining(options, state.get()));
  state->options = std::move(options);
  return std::unique_ptr<Profiler>(new Profiler(std::move(state)));
}

absl::StatusOr<v1::Profile> Profiler::Run() {
  State& s = *state_;
  const ProfilerOptions& o = s.options;
  v1::Profile profile;
  profile.set_graph_fingerprint(s.graph->fingerprint());
  profile.set_model_sha256(o.model_sha256);
  profile.set_batch_size(o.batch_size);
  for (const auto& spec : o.inputs) *profile.add_inputs() = spec;
  *profile.mutable_loss() = o.loss;
  *profile.mutable_optimizer() = o.optimizer;
  profile.set_warmup_iterations(o.warmup_iterations);
  profile.set_measure_iterations(o.measure_iterations);
  for (const IrNode& ir : s.graph->nodes()) {
    v1::ProfileNode* node = profile.add_nodes();
    node->set_id(ir.id);
    node->set_kind(ir.kind);
    node->set_scope(ir.scope);
    for (int input : ir.input_nodes) node->add_input_nodes(input);
    node->set_is_op(ir.is_op);
  }

  auto result = [&]() -> absl::Status {
    s.backend->SetTag(kIdleTag);
    *profile.mutable_device() = s.backend->Describe();
    s.current_step = "generating inputs";
    MUTWO_RETURN_IF_ERROR(Guard(s.current_step, [&]() -> absl::Status {
      MUTWO_ASSIGN_OR_RETURN(
          std::vector<torch::Tensor> inputs,
          MakeInputs(o.inputs, o.batch_size, s.device, o.seed));
      MUTWO_ASSIGN_OR_RETURN(s.targets,
                             MakeTargets(o.loss, o.batch_size, s.device));
      s.inputs.assign(inputs.begin(), inputs.end());
      std::vector<torch::Tensor> all = inputs;
      all.insert(all.end(), s.targets.begin(), s.targets.end());
      v1::FixedMemory* fixed = profile.mutable_fixed();
      std::vector<torch::Tensor> params, buffers;
      for (const torch::Tensor& p : s.module.parameters()) params.push_back(p);
      for (const torch::Tensor& b : s.module.buffers()) buffers.push_back(b);
      fixed->set_parameter_bytes(StorageBytes(params));
      fixed->set_buffer_bytes(StorageBytes(buffers));
      fixed->set_gradient_bytes(StorageBytes(s.parameters));
      fixed->set_optimizer_state_bytes(
          OptimizerStatesPerParameter(o.optimizer.kind()) *
          StorageBytes(s.parameters));
      fixed->set_input_bytes(StorageBytes(all));
      MUTWO_ASSIGN_OR_RETURN(s.optimizer,
                             MakeOptimizer(o.optimizer, s.parameters));
      return absl::OkStatus();
    }));
    MUTWO_RETURN_IF_ERROR(s.CheckCorrectness(&profile));
    MUTWO_RETURN_IF_ERROR(s.MeasureModuleStep(&profile));
    std::vector<IterationRecord> records;
    for (int it = 0; it < o.warmup_iterations + o.measure_iterations; ++it) {
      IterationRecord record;
      MUTWO_RETURN_IF_ERROR(s.InterpretedStep(&record));
      if (it >= o.warmup_iterations) records.push_back(std::move(record));
    }
    s.Fill(records, &profile);
    MUTWO_ASSIGN_OR_RETURN(const double clean_ms, s.CleanStepMs());
    ScaleTimes(clean_ms, &profile);
    return Guard("measuring the replay overhead", [&]() {
      profile.mutable_measured()->set_replay_overhead_ms(
          MeasureReplayOverheadMs(s.device,
                                  [&]() { s.backend->Synchronize(); }));
      return absl::OkStatus();
    });
  }();
  s.backend->SetTag(kIdleTag);
  s.ZeroGrads();
  if (absl::IsResourceExhausted(result)) {
    profile.set_oom(true);
    profile.set_oom_step(std::string(result.message()));
    return profile;
  }
  if (!result.ok()) {
    return absl::Status(result.code(), absl::StrCat("model ", o.model_name,
                                                    ": ", result.message()));
  }
  return profile;
}

}  // namespace mutwo::worker
