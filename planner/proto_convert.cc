#include "planner/proto_convert.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "planner/simulator.h"

namespace mutwo::planner {
namespace {

absl::Status Bad(const std::string& field, int64_t value,
                 const std::string& expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, ": ", expected));
}

// The IR node whose backward step sits at timeline `position` (forward
// positions are nodes, then one per backward step); -1 if none.
int PrefetchNode(const v1::Profile& profile, int position) {
  const int k = position - profile.nodes_size();
  if (k < 0 || k >= profile.backward_steps_size()) return -1;
  return profile.backward_steps(k).forward_node();
}

// Decision fields naming what a user finds in the eager model.
void SetModuleFields(const v1::Profile& profile, const v1::Activation* a,
                     v1::Decision* out) {
  const int node = out->producer_node();
  if (node >= 0 && node < profile.nodes_size()) {
    out->set_module_path(profile.nodes(node).scope());
    out->set_op_kind(profile.nodes(node).kind());
  }
  out->set_output_index(
      a != nullptr && a->output_indices_size() > 0 ? a->output_indices(0) : -1);
}

}  // namespace

double TimeScale(const v1::MeasuredStep& measured) {
  const double interpreted_ms = measured.iteration_ms();
  const double module_ms = measured.module_iteration_ms();
  if (!(interpreted_ms > 0) || !(module_ms > 0) ||
      module_ms >= interpreted_ms || !std::isfinite(interpreted_ms)) {
    return 1;
  }
  return module_ms / interpreted_ms;
}

absl::StatusOr<std::vector<BatchProfile>> BatchProfilesFromProto(
    const std::vector<v1::Profile>& profiles) {
  if (profiles.empty()) {
    return absl::InvalidArgumentError("max batch size needs profiles");
  }
  std::vector<BatchProfile> batch_profiles;
  for (const v1::Profile& profile : profiles) {
    auto p = ProfileFromProto(profile);
    if (!p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("profile at batch size ",
                                                     profile.batch_size(), ": ",
                                                     p.status().message()));
    }
    batch_profiles.push_back(BatchProfile{profile.batch_size(), *std::move(p)});
  }
  return batch_profiles;
}

namespace {

absl::Status CheckBytes(const std::string& field, int64_t value) {
  if (value < 0 || value > kMaxProfileBytes) {
    return Bad(field, value,
               absl::StrCat("must be in [0, ", kMaxProfileBytes, "] bytes"));
  }
  return absl::OkStatus();
}

// Counts and byte figures, before anything is converted: the checks that
// keep sums of figures from overflowing int64.
absl::Status CheckProfileMagnitudes(const v1::Profile& profile) {
  if (profile.nodes_size() > kMaxProfileNodes) {
    return Bad("nodes (count)", profile.nodes_size(),
               absl::StrCat("at most ", kMaxProfileNodes));
  }
  if (profile.backward_steps_size() > kMaxProfileNodes) {
    return Bad("backward_steps (count)", profile.backward_steps_size(),
               absl::StrCat("at most ", kMaxProfileNodes));
  }
  if (profile.activations_size() > kMaxProfileActivations) {
    return Bad("activations (count)", profile.activations_size(),
               absl::StrCat("at most ", kMaxProfileActivations));
  }
  const v1::FixedMemory& f = profile.fixed();
  MUTWO_RETURN_IF_ERROR(
      CheckBytes("fixed.parameter_bytes", f.parameter_bytes()));
  MUTWO_RETURN_IF_ERROR(CheckBytes("fixed.gradient_bytes", f.gradient_bytes()));
  MUTWO_RETURN_IF_ERROR(
      CheckBytes("fixed.optimizer_state_bytes", f.optimizer_state_bytes()));
  MUTWO_RETURN_IF_ERROR(CheckBytes("fixed.input_bytes", f.input_bytes()));
  const v1::MeasuredStep& m = profile.measured();
  MUTWO_RETURN_IF_ERROR(CheckBytes("measured.peak_bytes", m.peak_bytes()));
  MUTWO_RETURN_IF_ERROR(
      CheckBytes("measured.loss_peak_bytes", m.loss_peak_bytes()));
  MUTWO_RETURN_IF_ERROR(
      CheckBytes("measured.optimizer_peak_bytes", m.optimizer_peak_bytes()));
  MUTWO_RETURN_IF_ERROR(
      CheckBytes("device.total_bytes", profile.device().total_bytes()));
  for (int i = 0; i < profile.nodes_size(); ++i) {
    const v1::ProfileNode& node = profile.nodes(i);
    const std::string f = absl::StrCat("nodes[", i, "]");
    MUTWO_RETURN_IF_ERROR(
        CheckBytes(f + ".allocated_bytes_after", node.allocated_bytes_after()));
    MUTWO_RETURN_IF_ERROR(
        CheckBytes(f + ".peak_bytes_during", node.peak_bytes_during()));
    if (node.transient_bytes() > kMaxProfileBytes) {
      return Bad(f + ".transient_bytes", node.transient_bytes(),
                 absl::StrCat("must be at most ", kMaxProfileBytes));
    }
  }
  for (int k = 0; k < profile.backward_steps_size(); ++k) {
    const v1::BackwardStep& step = profile.backward_steps(k);
    const std::string f = absl::StrCat("backward_steps[", k, "]");
    MUTWO_RETURN_IF_ERROR(
        CheckBytes(f + ".allocated_bytes_after", step.allocated_bytes_after()));
    MUTWO_RETURN_IF_ERROR(
        CheckBytes(f + ".peak_bytes_during", step.peak_bytes_during()));
  }
  int64_t sources = 0;
  for (const v1::Activation& a : profile.activations()) {
    sources += a.recompute_sources_size();
  }
  const int64_t max_sources = int64_t{kMaxMeanRecomputeSources} *
                              std::max<int64_t>(1, profile.activations_size());
  if (sources > max_sources) {
    // Recompute lineages this dense cost the planner cubic time (a valid
    // 4k-activation profile with every activation rebuilt from all earlier
    // ones took over a minute); real ops have a few inputs each.
    return Bad(
        "activations[].recompute_sources (total)", sources,
        absl::StrCat("at most ", kMaxMeanRecomputeSources,
                     " per activation on average (", max_sources, " for ",
                     profile.activations_size(), " activations)"));
  }
  int64_t activation_bytes = 0;
  for (int i = 0; i < profile.activations_size(); ++i) {
    const v1::Activation& a = profile.activations(i);
    const std::string f =
        absl::StrCat("activations[", i, "] (value_id ", a.value_id(), ")");
    MUTWO_RETURN_IF_ERROR(CheckBytes(f + ".size_bytes", a.size_bytes()));
    activation_bytes += a.size_bytes();
    if (activation_bytes > kMaxProfileBytes) {
      return Bad("activations (total size_bytes)", activation_bytes,
                 absl::StrCat("must be at most ", kMaxProfileBytes));
    }
    if (a.recompute_sources_size() > profile.activations_size() ||
        a.recompute_nodes_size() > profile.nodes_size()) {
      return Bad(f + ".recompute_sources/recompute_nodes (count)",
                 std::max(a.recompute_sources_size(), a.recompute_nodes_size()),
                 "more entries than the profile has activations or nodes");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateProfile(const v1::Profile& profile) {
  if (profile.batch_size() <= 0) {
    return Bad("batch_size", profile.batch_size(), "must be positive");
  }
  if (!profile.oom() && profile.nodes_size() == 0) {
    return absl::InvalidArgumentError(
        "nodes: the profile has no forward nodes");
  }
  if (profile.oom()) return CheckProfileMagnitudes(profile);
  return ProfileFromProto(profile).status();
}

namespace {

// ProfileFromProto's phases, in order: each checks its part of the
// profile and fills its part of `out`.
absl::Status NodesFromProto(const v1::Profile& profile, PlanProfile& out) {
  const int n = profile.nodes_size();
  out.nodes.resize(n);
  for (int i = 0; i < n; ++i) {
    const v1::ProfileNode& node = profile.nodes(i);
    const std::string f = absl::StrCat("nodes[", i, "]");
    if (node.id() != i) {
      return Bad(f + ".id", node.id(),
                 absl::StrCat("expected ", i, " (node ids are positions)"));
    }
    if (node.forward_ms() < 0 || !std::isfinite(node.forward_ms())) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ".forward_ms = ", node.forward_ms(),
                       ": must be a finite time >= 0"));
    }
    if (node.host_ms() < 0 || !std::isfinite(node.host_ms())) {
      return absl::InvalidArgumentError(absl::StrCat(
          f, ".host_ms = ", node.host_ms(), ": must be a finite time >= 0"));
    }
    if (node.allocated_bytes_after() < 0 || node.peak_bytes_during() < 0) {
      return Bad(
          f + ".allocated_bytes_after",
          std::min(node.allocated_bytes_after(), node.peak_bytes_during()),
          "allocator figures must be >= 0");
    }
    PlanNode& pn = out.nodes[i];
    pn.forward_ms = node.forward_ms();
    pn.host_ms = node.host_ms();
    pn.allocated_bytes_after = node.allocated_bytes_after();
    pn.peak_bytes_during = node.peak_bytes_during();
    pn.transient_bytes = std::max<int64_t>(0, node.transient_bytes());
    pn.is_op = node.is_op();
    pn.scope = node.scope();
  }
  return absl::OkStatus();
}

absl::Status BackwardStepsFromProto(const v1::Profile& profile,
                                    PlanProfile& out) {
  out.backward_steps.resize(profile.backward_steps_size());
  for (int k = 0; k < profile.backward_steps_size(); ++k) {
    const v1::BackwardStep& s = profile.backward_steps(k);
    const std::string f = absl::StrCat("backward_steps[", k, "]");
    if (s.ms() < 0 || !std::isfinite(s.ms())) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ".ms = ", s.ms(), ": must be a finite time >= 0"));
    }
    if (s.allocated_bytes_after() < 0 || s.peak_bytes_during() < 0) {
      return Bad(f + ".allocated_bytes_after",
                 std::min(s.allocated_bytes_after(), s.peak_bytes_during()),
                 "allocator figures must be >= 0");
    }
    out.backward_steps[k] =
        PlanBackwardStep{s.ms(), s.forward_node(), s.allocated_bytes_after(),
                         s.peak_bytes_during()};
  }
  return absl::OkStatus();
}

absl::Status ActivationsFromProto(const v1::Profile& profile,
                                  PlanProfile& out) {
  absl::flat_hash_map<int, int> index_of;
  for (int i = 0; i < profile.activations_size(); ++i) {
    const int id = profile.activations(i).value_id();
    if (!index_of.emplace(id, i).second) {
      return Bad(absl::StrCat("activations[", i, "].value_id"), id,
                 absl::StrCat("duplicate of activations[", index_of[id], "]"));
    }
  }
  out.activations.resize(profile.activations_size());
  for (int i = 0; i < profile.activations_size(); ++i) {
    const v1::Activation& a = profile.activations(i);
    const std::string f =
        absl::StrCat("activations[", i, "] (value_id ", a.value_id(), ")");
    for (double v : {a.inactive_ms(), a.recompute_ms(), a.swap_ms()}) {
      if (v < 0 || !std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            f,
            ": inactive_ms, recompute_ms and swap_ms must be finite and "
            ">= 0, got ",
            v));
      }
    }
    PlanActivation& pa = out.activations[i];
    pa.value_id = a.value_id();
    pa.producer_node = a.producer_node();
    pa.size_bytes = a.size_bytes();
    pa.last_forward_use = a.last_forward_use();
    pa.first_backward_use = a.first_backward_use();
    pa.last_backward_use = a.last_backward_use();
    pa.inactive_ms = a.inactive_ms();
    pa.recompute_ms = a.recompute_ms();
    pa.swap_ms = a.swap_ms();
    if (a.unswappable_bytes() < 0 || a.unswappable_bytes() > a.size_bytes()) {
      return Bad(
          f + ".unswappable_bytes", a.unswappable_bytes(),
          absl::StrCat("must be in [0, size_bytes ", a.size_bytes(), "]"));
    }
    pa.swappable = a.unswappable_bytes() * 100 <= a.size_bytes();
    pa.recomputable = a.not_recomputable().empty();
    for (int src : a.recompute_sources()) {
      auto it = index_of.find(src);
      if (it == index_of.end() || it->second == i) {
        return Bad(f + ".recompute_sources[]", src,
                   "must be the value_id of another activation");
      }
      pa.recompute_sources.push_back(it->second);
    }
    pa.recompute_nodes.assign(a.recompute_nodes().begin(),
                              a.recompute_nodes().end());
  }
  return absl::OkStatus();
}

absl::Status TimeModelFromProto(const v1::Profile& profile, PlanProfile& out) {
  const v1::FixedMemory& fixed = profile.fixed();
  out.fixed_bytes = fixed.parameter_bytes() + fixed.gradient_bytes() +
                    fixed.optimizer_state_bytes() + fixed.input_bytes();
  out.measured_peak_bytes = profile.measured().peak_bytes();
  out.measured_iteration_ms = profile.measured().iteration_ms();
  // Time model. Node, backward-step and recompute times come from the
  // interpreted step synchronised after every node (measured.iteration_ms),
  // which is slower than the plain module step (module_iteration_ms) that
  // the executor's steps match. When both are measured, every compute time
  // is scaled by module / interpreted, so the no-checkpointing schedule
  // predicts the module step and replays cost their share of it. Transfer
  // times (size / bandwidth) are not scaled. Never scaled up: a module step
  // slower than the synchronised interpreted one is TorchScript's graph
  // executor still profiling and compiling (a Transformer on an H200: 389
  // vs 50 ms), not the step the executor runs.
  const double interpreted_ms = profile.measured().iteration_ms();
  const double module_ms = profile.measured().module_iteration_ms();
  if (!std::isfinite(interpreted_ms) || !std::isfinite(module_ms) ||
      interpreted_ms < 0 || module_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("measured.iteration_ms = ", interpreted_ms,
                     ", measured.module_iteration_ms = ", module_ms,
                     ": must be finite times >= 0"));
  }
  const double overhead = profile.measured().replay_overhead_ms();
  if (!std::isfinite(overhead) || overhead < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("measured.replay_overhead_ms = ", overhead,
                     ": must be a finite time >= 0"));
  }
  // Host times are measured as they are paid: not scaled below.
  out.replay_overhead_ms = overhead;
  const double scale = TimeScale(profile.measured());
  if (scale != 1) {
    for (PlanNode& node : out.nodes) node.forward_ms *= scale;
    for (PlanBackwardStep& step : out.backward_steps) step.ms *= scale;
    for (PlanActivation& a : out.activations) {
      a.inactive_ms *= scale;
      a.recompute_ms *= scale;
    }
    out.measured_iteration_ms = module_ms;
  }
  return absl::OkStatus();
}

absl::Status DeviceFromProto(const v1::Profile& profile, PlanProfile& out) {
  out.device_total_bytes = profile.device().total_bytes();
  if (profile.device().host_to_device_bytes_per_second() < 0 ||
      profile.device().device_to_host_bytes_per_second() < 0) {
    return absl::InvalidArgumentError(
        "device.host_to_device_bytes_per_second and "
        "device.device_to_host_bytes_per_second must be >= 0");
  }
  out.host_to_device_bytes_per_second =
      profile.device().host_to_device_bytes_per_second();
  out.device_to_host_bytes_per_second =
      profile.device().device_to_host_bytes_per_second();
  return absl::OkStatus();
}

absl::Status StepPeaksFromProto(const v1::Profile& profile, PlanProfile& out) {
  // Two allocator peaks of the training step lie outside the IR timeline.
  // The loss runs right after the last forward node, with that node's
  // activations held: its peak belongs to that position (a schedule that
  // frees activations lowers it). The optimizer step runs after backward,
  // when no activation is left: it becomes one more position, a floor no
  // schedule lowers (its time is already in the measured iteration).
  const v1::MeasuredStep& m = profile.measured();
  if (m.loss_peak_bytes() < 0 || m.optimizer_peak_bytes() < 0) {
    return absl::InvalidArgumentError(
        "measured.loss_peak_bytes and measured.optimizer_peak_bytes must be "
        ">= 0");
  }
  if (m.loss_peak_bytes() > 0) {
    out.nodes.back().peak_bytes_during =
        std::max(out.nodes.back().peak_bytes_during, m.loss_peak_bytes());
  }
  if (m.optimizer_peak_bytes() > 0) {
    const int64_t after = out.backward_steps.empty()
                              ? out.nodes.back().allocated_bytes_after
                              : out.backward_steps.back().allocated_bytes_after;
    // Same time scale as the other steps (see the time model above).
    const double optimizer_ms = m.optimizer_ms() * TimeScale(m);
    out.backward_steps.push_back(
        PlanBackwardStep{optimizer_ms, -1, after, m.optimizer_peak_bytes()});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlanProfile> ProfileFromProto(const v1::Profile& profile) {
  MUTWO_RETURN_IF_ERROR(CheckProfileMagnitudes(profile));
  PlanProfile out;
  MUTWO_RETURN_IF_ERROR(NodesFromProto(profile, out));
  MUTWO_RETURN_IF_ERROR(BackwardStepsFromProto(profile, out));
  MUTWO_RETURN_IF_ERROR(ActivationsFromProto(profile, out));
  MUTWO_RETURN_IF_ERROR(TimeModelFromProto(profile, out));
  MUTWO_RETURN_IF_ERROR(DeviceFromProto(profile, out));
  // The structural invariants (positions in range and ordered, ids that
  // exist) are the simulator's, checked once for every way a profile
  // reaches the planner; here on the profile's own positions, before the
  // optimizer step below adds one.
  MUTWO_RETURN_IF_ERROR(ValidatePlanProfile(&out));
  MUTWO_RETURN_IF_ERROR(StepPeaksFromProto(profile, out));
  return out;
}

absl::StatusOr<Policy> ParsePolicy(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "mutwo") return Policy::kMutwo;
  if (t == "sqrt_n") return Policy::kSqrtN;
  if (t == "per_block") return Policy::kPerBlock;
  if (t == "none") return Policy::kNone;
  return absl::InvalidArgumentError(absl::StrCat(
      "policy \"", text, "\": expected mutwo, sqrt_n, per_block or none"));
}

Policy PolicyFromProto(v1::Policy policy) {
  switch (policy) {
    case v1::SQRT_N:
      return Policy::kSqrtN;
    case v1::PER_BLOCK:
      return Policy::kPerBlock;
    case v1::NONE:
      return Policy::kNone;
    default:
      return Policy::kMutwo;
  }
}

v1::Policy PolicyToProto(Policy policy) {
  switch (policy) {
    case Policy::kMutwo:
      return v1::MUTWO;
    case Policy::kSqrtN:
      return v1::SQRT_N;
    case Policy::kPerBlock:
      return v1::PER_BLOCK;
    case Policy::kNone:
      return v1::NONE;
  }
  return v1::POLICY_UNSPECIFIED;
}

v1::Schedule ScheduleToProto(const v1::Profile& profile,
                             const PlanProfile& plan_profile,
                             const PlanResult& result,
                             const v1::MemoryBudget& budget,
                             int max_timeline_samples) {
  v1::Schedule s;
  s.set_policy(PolicyToProto(result.policy));
  s.set_planner_version(kPlannerVersion);
  s.set_graph_fingerprint(profile.graph_fingerprint());
  s.set_model_sha256(profile.model_sha256());
  s.set_batch_size(profile.batch_size());
  *s.mutable_inputs() = profile.inputs();
  if (profile.has_loss()) *s.mutable_loss() = profile.loss();
  if (profile.has_optimizer()) *s.mutable_optimizer() = profile.optimizer();
  *s.mutable_budget() = budget;
  s.set_budget_bytes(result.budget_bytes);
  s.set_feasible(result.feasible);
  s.set_floor_bytes(result.floor_bytes);
  s.set_predicted_peak_bytes(result.sim.peak_bytes);
  s.set_predicted_iteration_ms(result.sim.iteration_ms);
  s.set_baseline_peak_bytes(result.baseline_peak_bytes);
  s.set_baseline_iteration_ms(result.baseline_iteration_ms);
  s.set_predicted_recompute_ms(result.sim.recompute_ms);
  s.set_predicted_stall_ms(result.sim.stall_ms);
  s.set_reason(result.reason);
  s.set_peak_position(result.sim.peak_position);
  s.set_recomputed(result.sim.recomputed);
  s.set_swapped(result.sim.swapped);
  absl::flat_hash_map<int, const v1::Activation*> activation_of;
  for (const v1::Activation& a : profile.activations()) {
    activation_of.emplace(a.value_id(), &a);
  }
  for (size_t i = 0; i < plan_profile.activations.size(); ++i) {
    const PlanActivation& a = plan_profile.activations[i];
    const Decision& d = result.decisions[i];
    v1::Decision* out = s.add_decisions();
    out->set_value_id(a.value_id);
    out->set_producer_node(a.producer_node);
    out->set_size_bytes(a.size_bytes);
    const auto found = activation_of.find(a.value_id);
    SetModuleFields(
        profile, found == activation_of.end() ? nullptr : found->second, out);
    switch (d.action) {
      case Action::kRetain:
        out->set_action(v1::Decision::RETAIN);
        break;
      case Action::kRecompute: {
        out->set_action(v1::Decision::RECOMPUTE);
        out->set_segment(result.sim.segment_of[i]);
        out->set_needed_at(result.sim.needed_at[i]);
        out->set_recompute_ms(result.sim.segment_ms_of[i]);
        out->add_recompute_nodes(a.producer_node);
        for (int node : a.recompute_nodes) {
          if (node != a.producer_node) out->add_recompute_nodes(node);
        }
        std::sort(out->mutable_recompute_nodes()->begin(),
                  out->mutable_recompute_nodes()->end());
        for (int node : out->recompute_nodes()) {
          out->add_recompute_module_paths(node >= 0 &&
                                                  node < profile.nodes_size()
                                              ? profile.nodes(node).scope()
                                              : std::string());
        }
        break;
      }
      case Action::kSwap:
        out->set_action(v1::Decision::SWAP);
        out->set_offload_after(a.last_forward_use);
        out->set_prefetch_at(d.prefetch_at >= 0 ? d.prefetch_at
                                                : result.sim.needed_at[i]);
        out->set_prefetch_node(PrefetchNode(profile, out->prefetch_at()));
        out->set_needed_at(result.sim.needed_at[i]);
        out->set_stall_ms(result.sim.stall_ms_of[i]);
        break;
    }
    // Simulator::Create refused activations naming other nodes: what the
    // planner decides names nodes of this profile only.
    MUTWO_DCHECK(out->producer_node() >= 0 &&
                 out->producer_node() < profile.nodes_size())
        << "decision " << i << ": producer node " << out->producer_node();
    for (int node : out->recompute_nodes()) {
      MUTWO_DCHECK(node >= 0 && node < profile.nodes_size())
          << "decision " << i << ": recompute node " << node;
    }
  }
  const int p = static_cast<int>(result.sim.planned_after_bytes.size());
  if (max_timeline_samples > 0 && p > 0) {
    const SimResult& sim = result.sim;
    const int stride = (p + max_timeline_samples - 1) / max_timeline_samples;
    int64_t baseline_peak = 0, planned_peak = 0;
    for (int t = 0; t < p; ++t) {
      // The high-water marks since the previous sample, so no peak is lost
      // to sampling.
      if (t < static_cast<int>(sim.baseline_during_bytes.size())) {
        baseline_peak = std::max(baseline_peak, sim.baseline_during_bytes[t]);
      }
      if (t < static_cast<int>(sim.planned_peak_bytes.size())) {
        planned_peak = std::max(planned_peak, sim.planned_peak_bytes[t]);
      }
      if (t % stride != 0 && t != sim.peak_position && t != p - 1) {
        continue;
      }
      v1::MemorySample* m = s.add_timeline();
      m->set_position(t);
      m->set_baseline_bytes(sim.baseline_after_bytes[t]);
      m->set_planned_bytes(sim.planned_after_bytes[t]);
      m->set_baseline_peak_bytes(baseline_peak);
      m->set_planned_peak_bytes(planned_peak);
      if (t < static_cast<int>(sim.baseline_end_ms.size())) {
        m->set_baseline_end_ms(sim.baseline_end_ms[t]);
      }
      if (t < static_cast<int>(sim.planned_end_ms.size())) {
        m->set_planned_end_ms(sim.planned_end_ms[t]);
      }
      baseline_peak = planned_peak = 0;
    }
  }
  return s;
}

absl::StatusOr<Decisions> DecisionsFromSchedule(const v1::Schedule& schedule,
                                                const v1::Profile& profile) {
  absl::flat_hash_map<int, int> index_of;
  for (int i = 0; i < profile.activations_size(); ++i) {
    index_of[profile.activations(i).value_id()] = i;
  }
  Decisions d(profile.activations_size());
  for (int k = 0; k < schedule.decisions_size(); ++k) {
    const v1::Decision& in = schedule.decisions(k);
    auto it = index_of.find(in.value_id());
    if (it == index_of.end()) {
      return Bad(absl::StrCat("decisions[", k, "].value_id"), in.value_id(),
                 "is not an activation of the profile");
    }
    Decision& out = d[it->second];
    switch (in.action()) {
      case v1::Decision::RECOMPUTE:
        out.action = Action::kRecompute;
        break;
      case v1::Decision::SWAP:
        out.action = Action::kSwap;
        out.prefetch_at = in.prefetch_at();
        break;
      default:
        out.action = Action::kRetain;
        break;
    }
  }
  return d;
}

}  // namespace mutwo::planner
