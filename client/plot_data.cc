#include "client/plot_data.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "google/protobuf/util/json_util.h"

namespace mutwo {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

Value Num(double v) {
  Value out;
  out.set_number_value(v);
  return out;
}
Value Str(const std::string& v) {
  Value out;
  out.set_string_value(v);
  return out;
}
Value Bool(bool v) {
  Value out;
  out.set_bool_value(v);
  return out;
}
Value Obj(Struct s) {
  Value out;
  *out.mutable_struct_value() = std::move(s);
  return out;
}
template <typename T>
Value Nums(const std::vector<T>& values) {
  Value out;
  ListValue* list = out.mutable_list_value();
  for (const T& v : values) list->add_values()->set_number_value(v);
  return out;
}
Value List(std::vector<Value> values) {
  Value out;
  ListValue* list = out.mutable_list_value();
  for (Value& v : values) *list->add_values() = std::move(v);
  return out;
}
void Set(Struct& s, const std::string& key, Value v) {
  (*s.mutable_fields())[key] = std::move(v);
}

Struct NewData(const std::string& kind, const std::string& title) {
  Struct s;
  Set(s, "format", Str(kPlotDataFormat));
  Set(s, "kind", Str(kind));
  Set(s, "title", Str(title));
  return s;
}

std::string PolicyName(v1::Policy policy) {
  switch (policy) {
    case v1::SQRT_N:
      return "sqrt_n";
    case v1::PER_BLOCK:
      return "per_block";
    case v1::NONE:
      return "none";
    default:
      return "mutwo";
  }
}

struct Curve {
  std::vector<int> position;
  std::vector<double> end_ms;
  std::vector<double> peak_bytes;
  std::vector<double> after_bytes;
  double backward_start_ms = 0;
};

Value CurveValue(const Curve& c, const std::string& name,
                 const std::string& role, const std::string& source) {
  Struct s;
  Set(s, "name", Str(name));
  Set(s, "role", Str(role));
  Set(s, "source", Str(source));
  Set(s, "position", Nums(c.position));
  Set(s, "end_ms", Nums(c.end_ms));
  Set(s, "peak_bytes", Nums(c.peak_bytes));
  Set(s, "after_bytes", Nums(c.after_bytes));
  if (c.backward_start_ms > 0) {
    Set(s, "backward_start_ms", Num(c.backward_start_ms));
  }
  return Obj(std::move(s));
}

// The sample before the first backward position ends the forward pass.
double BackwardStartMs(const Curve& c, int forward_positions) {
  double start = 0;
  for (size_t i = 0; i < c.position.size(); ++i) {
    if (c.position[i] < forward_positions) start = c.end_ms[i];
  }
  return start;
}

// "layer1.0.conv1 (aten::conv2d)" for the activation made by `node`.
std::string NodeName(const v1::Profile& profile, int node) {
  if (node < 0 || node >= profile.nodes_size()) {
    return absl::StrCat("node ", node);
  }
  const v1::ProfileNode& n = profile.nodes(node);
  return absl::StrCat(n.scope().empty() ? "<top>" : n.scope(), " (", n.kind(),
                      ")");
}

Value Interval(int first, int last) {
  return Nums(std::vector<int>{first, std::max(first, last)});
}

}  // namespace

Struct TimelinePlotData(const v1::Schedule& schedule,
                        const v1::Profile& profile,
                        const std::string& model_name) {
  const std::string policy = v1::Policy_Name(schedule.policy());
  Struct data = NewData(
      "timeline",
      absl::StrCat("Memory over one training step: ", model_name, ", batch ",
                   schedule.batch_size(), ", ", PolicyName(schedule.policy()),
                   " at budget ", FormatBytes(schedule.budget_bytes())));
  Set(data, "model", Str(model_name));
  Set(data, "batch", Num(static_cast<double>(schedule.batch_size())));
  Set(data, "policy", Str(policy));
  Set(data, "budget_bytes", Num(static_cast<double>(schedule.budget_bytes())));
  if (schedule.budget().kind_case() != v1::MemoryBudget::KIND_NOT_SET) {
    Set(data, "budget_text", Str(FormatBudget(schedule.budget())));
  }
  Set(data, "feasible", Bool(schedule.feasible()));
  Set(data, "reason", Str(schedule.reason()));
  Set(data, "predicted_peak_bytes",
      Num(static_cast<double>(schedule.predicted_peak_bytes())));
  Set(data, "baseline_peak_bytes",
      Num(static_cast<double>(schedule.baseline_peak_bytes())));
  Set(data, "floor_bytes", Num(static_cast<double>(schedule.floor_bytes())));
  Set(data, "measured_peak_bytes",
      Num(static_cast<double>(schedule.measured_peak_bytes())));
  const v1::FixedMemory& fixed = profile.fixed();
  Set(data, "fixed_bytes",
      Num(static_cast<double>(fixed.parameter_bytes() + fixed.gradient_bytes() +
                              fixed.optimizer_state_bytes() +
                              fixed.input_bytes())));
  const int forward_positions = profile.nodes_size();
  Set(data, "forward_positions", Num(forward_positions));

  // The simulated curves. Schedules planned before the peak and time
  // fields existed have neither: their curves are the bytes after each
  // position, over positions (the renderer says so).
  Curve baseline, planned;
  for (const v1::MemorySample& m : schedule.timeline()) {
    for (Curve* c : {&baseline, &planned}) c->position.push_back(m.position());
    baseline.end_ms.push_back(m.baseline_end_ms());
    planned.end_ms.push_back(m.planned_end_ms());
    baseline.after_bytes.push_back(static_cast<double>(m.baseline_bytes()));
    planned.after_bytes.push_back(static_cast<double>(m.planned_bytes()));
    baseline.peak_bytes.push_back(static_cast<double>(
        std::max(m.baseline_peak_bytes(), m.baseline_bytes())));
    planned.peak_bytes.push_back(static_cast<double>(
        std::max(m.planned_peak_bytes(), m.planned_bytes())));
  }
  baseline.backward_start_ms = BackwardStartMs(baseline, forward_positions);
  planned.backward_start_ms = BackwardStartMs(planned, forward_positions);
  std::vector<Value> series;
  if (!baseline.position.empty()) {
    series.push_back(CurveValue(baseline, "no checkpointing, simulated",
                                "baseline", "simulated"));
    series.push_back(CurveValue(planned,
                                absl::StrCat(policy, " schedule, simulated"),
                                "planned", "simulated"));
  }
  // What the profiler measured of the step without checkpointing.
  Curve measured;
  double t = 0;
  auto add = [&](int position, double ms, int64_t after, int64_t peak) {
    t += ms;
    measured.position.push_back(position);
    measured.end_ms.push_back(t);
    measured.after_bytes.push_back(static_cast<double>(after));
    measured.peak_bytes.push_back(static_cast<double>(std::max(after, peak)));
  };
  bool has_measured = false;
  for (int i = 0; i < profile.nodes_size(); ++i) {
    const v1::ProfileNode& n = profile.nodes(i);
    has_measured |= n.allocated_bytes_after() > 0;
    add(i, n.forward_ms(), n.allocated_bytes_after(), n.peak_bytes_during());
  }
  for (int k = 0; k < profile.backward_steps_size(); ++k) {
    const v1::BackwardStep& s = profile.backward_steps(k);
    add(forward_positions + k, s.ms(), s.allocated_bytes_after(),
        s.peak_bytes_during());
  }
  if (has_measured && !baseline.position.empty() &&
      baseline.end_ms.back() > 0 && t > 0) {
    // The profiler times ops in its interpreter, slower than the step the
    // planner models (it scales them to the measured module step): the
    // measured curve is put on the simulated step's time base.
    const double scale = baseline.end_ms.back() / t;
    for (double& ms : measured.end_ms) ms *= scale;
    measured.backward_start_ms = BackwardStartMs(measured, forward_positions);
    series.push_back(CurveValue(measured,
                                "no checkpointing, profiled (time rescaled)",
                                "baseline", "measured"));
  }
  Set(data, "series", List(std::move(series)));

  // Live intervals (inclusive timeline positions) of each activation.
  std::map<int, const v1::Decision*> decision_of;
  for (const v1::Decision& d : schedule.decisions()) {
    decision_of[d.value_id()] = &d;
  }
  std::vector<Value> activations;
  for (const v1::Activation& a : profile.activations()) {
    Struct s;
    Set(s, "id", Num(a.value_id()));
    Set(s, "name", Str(NodeName(profile, a.producer_node())));
    Set(s, "size", Num(static_cast<double>(a.size_bytes())));
    const int made = a.producer_node();
    const int last = std::max(a.last_backward_use(), made);
    Set(s, "baseline", List({Interval(made, last)}));
    auto it = decision_of.find(a.value_id());
    const v1::Decision* d = it == decision_of.end() ? nullptr : it->second;
    const v1::Decision::Action action =
        d == nullptr ? v1::Decision::RETAIN : d->action();
    Set(s, "action", Str(v1::Decision::Action_Name(action)));
    if (action == v1::Decision::RECOMPUTE || action == v1::Decision::SWAP) {
      const int gone = action == v1::Decision::SWAP
                           ? std::max(d->offload_after(), made)
                           : std::max(a.last_forward_use(), made);
      const int back = d->needed_at() > gone ? d->needed_at() : last;
      Set(s, "planned",
          List({Interval(made, gone), Interval(std::min(back, last), last)}));
    } else {
      Set(s, "planned", List({Interval(made, last)}));
    }
    activations.push_back(Obj(std::move(s)));
  }
  Set(data, "activations", List(std::move(activations)));
  return data;
}

Struct BatchPlotData(const v1::Job& job) {
  Struct data = NewData("batch", absl::StrCat("Peak memory vs batch size: ",
                                              job.spec().model_name()));
  Set(data, "model", Str(job.spec().model_name()));
  auto point = [](int64_t batch, int64_t bytes) {
    Struct p;
    Set(p, "batch", Num(static_cast<double>(batch)));
    Set(p, "peak_bytes", Num(static_cast<double>(bytes)));
    return Obj(std::move(p));
  };
  std::vector<Value> series;
  std::vector<Value> baseline;
  for (const v1::BatchResult& r : job.results()) {
    if (r.baseline_peak_bytes() > 0) {
      baseline.push_back(point(r.batch_size(), r.baseline_peak_bytes()));
    }
  }
  {
    Struct s;
    Set(s, "name", Str("baseline (no checkpointing), measured by profiling"));
    Set(s, "policy", Str("none"));
    Set(s, "source", Str("measured"));
    Set(s, "points", List(std::move(baseline)));
    series.push_back(Obj(std::move(s)));
  }
  // Results keep one schedule and outcome per requested budget, in the
  // order of the job's budgets.
  std::vector<Value> infeasible;
  for (int j = 0; j < job.spec().budgets_size(); ++j) {
    const std::string text = FormatBudget(job.spec().budgets(j));
    std::vector<Value> predicted, measured;
    for (const v1::BatchResult& r : job.results()) {
      if (j >= r.schedules_size()) continue;
      const v1::Schedule& s = r.schedules(j);
      const v1::BudgetOutcome* o =
          j < r.outcomes_size() ? &r.outcomes(j) : nullptr;
      if (s.feasible()) {
        predicted.push_back(point(r.batch_size(), s.predicted_peak_bytes()));
      }
      const int64_t measured_peak = o != nullptr && o->measured_peak_bytes() > 0
                                        ? o->measured_peak_bytes()
                                        : s.measured_peak_bytes();
      if (measured_peak > 0) {
        measured.push_back(point(r.batch_size(), measured_peak));
      }
      const bool below_floor =
          !s.feasible() ||
          (o != nullptr && o->state() == v1::BudgetOutcome::INFEASIBLE);
      const bool over =
          o != nullptr && (o->state() == v1::BudgetOutcome::OVER_BUDGET ||
                           o->state() == v1::BudgetOutcome::FAILED);
      if (below_floor || over) {
        Struct p;
        Set(p, "batch", Num(static_cast<double>(r.batch_size())));
        Set(p, "budget_bytes", Num(static_cast<double>(s.budget_bytes())));
        Set(p, "budget", Str(text));
        Set(p, "why",
            Str(below_floor ? "below the floor"
                            : v1::BudgetOutcome::State_Name(o->state())));
        infeasible.push_back(Obj(std::move(p)));
      }
    }
    for (auto* pts : {&predicted, &measured}) {
      const bool is_predicted = pts == &predicted;
      Struct s;
      Set(s, "name",
          Str(absl::StrCat("budget ", text, ": ",
                           is_predicted ? "predicted" : "measured")));
      Set(s, "budget", Str(text));
      Set(s, "source", Str(is_predicted ? "predicted" : "measured"));
      Set(s, "points", List(std::move(*pts)));
      series.push_back(Obj(std::move(s)));
    }
  }
  Set(data, "series", List(std::move(series)));
  Set(data, "infeasible", List(std::move(infeasible)));
  if (job.has_max_batch() && job.max_batch().capacity_bytes() > 0) {
    const v1::MaxBatchPrediction& m = job.max_batch();
    Struct mb;
    Set(mb, "capacity_bytes", Num(static_cast<double>(m.capacity_bytes())));
    Set(mb, "without",
        Num(static_cast<double>(m.max_batch_without_checkpointing())));
    Set(mb, "with", Num(static_cast<double>(m.max_batch_with_schedule())));
    // Whether a step on a worker measured each answer within the capacity
    // (one step answers both when they agree).
    const bool without_verified =
        m.without_checkpointing_check().state() == v1::MaxBatchCheck::VERIFIED;
    Set(mb, "without_verified", Bool(without_verified));
    Set(mb, "with_verified",
        Bool(m.has_with_schedule_check() ? m.with_schedule_check().state() ==
                                               v1::MaxBatchCheck::VERIFIED
                                         : without_verified));
    Set(mb, "bytes_per_sample", Num(m.bytes_per_sample()));
    Set(mb, "bytes_intercept", Num(static_cast<double>(m.bytes_intercept())));
    Set(mb, "reason", Str(m.reason()));
    Set(data, "max_batch", Obj(std::move(mb)));
  }
  return data;
}

Struct ParetoPlotData(const v1::Schedule& mutwo,
                      const std::vector<v1::Schedule>& others,
                      const std::string& model_name,
                      const v1::BatchResult* result) {
  Struct data = NewData(
      "pareto", absl::StrCat("Peak memory vs iteration time: ", model_name,
                             ", batch ", mutwo.batch_size()));
  if (mutwo.feasible()) {
    Set(data, "subtitle",
        Str("predicted by the planner's memory and time model"));
  } else {
    Set(data, "infeasible", Bool(true));
    Set(data, "subtitle",
        Str(absl::StrCat("INFEASIBLE: the budget ",
                         FormatBytes(mutwo.budget_bytes()),
                         " is below the lowest peak mutwo reaches (floor ",
                         FormatBytes(mutwo.floor_bytes()), ")")));
  }
  Set(data, "model", Str(model_name));
  Set(data, "batch", Num(static_cast<double>(mutwo.batch_size())));
  {
    Struct base;
    Set(base, "peak_bytes",
        Num(static_cast<double>(mutwo.baseline_peak_bytes())));
    Set(base, "iteration_ms", Num(mutwo.baseline_iteration_ms()));
    Set(data, "baseline", Obj(std::move(base)));
  }
  Set(data, "budget_bytes", Num(static_cast<double>(mutwo.budget_bytes())));
  if (mutwo.floor_bytes() > 0) {
    Set(data, "floor_bytes", Num(static_cast<double>(mutwo.floor_bytes())));
  }
  if (result != nullptr && result->has_knee() &&
      result->knee().predicted_peak_bytes() > 0) {
    const v1::ParetoPoint& k = result->knee();
    const double base_ms = result->plan_baseline_iteration_ms() > 0
                               ? result->plan_baseline_iteration_ms()
                               : result->baseline_iteration_ms();
    Struct knee;
    Set(knee, "budget_bytes", Num(static_cast<double>(k.budget_bytes())));
    Set(knee, "peak_bytes", Num(static_cast<double>(k.predicted_peak_bytes())));
    Set(knee, "iteration_ms", Num(k.predicted_iteration_ms()));
    if (base_ms > 0) {
      Set(knee, "overhead", Num(k.predicted_iteration_ms() / base_ms - 1));
    }
    Set(data, "knee", Obj(std::move(knee)));
  }
  auto point = [](int64_t peak, double ms) {
    Struct p;
    Set(p, "peak_bytes", Num(static_cast<double>(peak)));
    Set(p, "iteration_ms", Num(ms));
    return Obj(std::move(p));
  };
  std::vector<Value> series;
  {
    std::vector<Value> curve;
    for (const v1::ParetoPoint& p : mutwo.pareto()) {
      curve.push_back(
          point(p.predicted_peak_bytes(), p.predicted_iteration_ms()));
    }
    Struct s;
    Set(s, "name", Str("mutwo: Pareto curve over budgets"));
    Set(s, "policy", Str("mutwo"));
    Set(s, "source", Str("predicted"));
    Set(s, "line", Bool(true));
    Set(s, "points", List(std::move(curve)));
    series.push_back(Obj(std::move(s)));
  }
  if (mutwo.feasible()) {
    Struct s;
    Set(s, "name",
        Str(absl::StrCat("mutwo at budget ",
                         FormatBytes(mutwo.budget_bytes()))));
    Set(s, "policy", Str("mutwo"));
    Set(s, "source", Str("predicted"));
    Set(s, "hollow", Bool(false));
    Set(s, "marker", Str("*"));
    Set(s, "line", Bool(false));
    Set(s, "points",
        List({point(mutwo.predicted_peak_bytes(),
                    mutwo.predicted_iteration_ms())}));
    series.push_back(Obj(std::move(s)));
  }
  for (const v1::Schedule& o : others) {
    Struct s;
    Set(s, "name", Str(PolicyName(o.policy())));
    Set(s, "policy", Str(PolicyName(o.policy())));
    Set(s, "source", Str("predicted"));
    Set(s, "hollow", Bool(false));
    Set(s, "marker", Str(o.policy() == v1::SQRT_N ? "D" : "^"));
    Set(s, "line", Bool(false));
    Set(s, "points",
        List({point(o.predicted_peak_bytes(), o.predicted_iteration_ms())}));
    series.push_back(Obj(std::move(s)));
  }
  Set(data, "series", List(std::move(series)));
  return data;
}

std::string PlotDataJson(const Struct& data) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  (void)google::protobuf::util::MessageToJsonString(data, &json, options);
  return json + "\n";
}

}  // namespace mutwo
