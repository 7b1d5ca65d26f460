#include "planner/simulator.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/dcheck.h"
#include "common/status_macros.h"

namespace mutwo::planner {
namespace {

// Adds `bytes` over the positions [begin, end] to the difference arrays of
// the high-water marks (`during`) and of the bytes after each position
// (`after`: [begin, end), the storage is released after `end`).
void AddInterval(int begin, int end, int64_t bytes, int last,
                 std::vector<int64_t>& after, std::vector<int64_t>& during) {
  if (end > last) end = last;
  if (begin > end) return;
  during[begin] += bytes;
  during[end + 1] -= bytes;
  if (end > begin) {
    after[begin] += bytes;
    after[end] -= bytes;
  }
}

}  // namespace

int64_t Simulator::ReplayTransient(
    std::vector<std::pair<int, int64_t>>& members,
    const std::vector<int>& nodes) const {
  std::sort(members.begin(), members.end());
  int64_t total = 0;
  for (const auto& m : members) total += m.second;
  int64_t made = 0, most = 0;
  size_t next = 0;
  for (int node : nodes) {
    while (next < members.size() && members[next].first <= node) {
      made += members[next++].second;
    }
    most = std::max(most, made + node_transient_[node] - total);
  }
  if (!forward_during_max_.empty() && !nodes.empty() && !members.empty()) {
    const int first = std::min(nodes.front(), members.front().first);
    const int last = members.back().first;
    if (first > 0 && last >= first) {
      const int64_t held =
          ForwardDuringMax(first, last) - base_after_[first - 1];
      most = std::max(most, held - total);
    }
  }
  return most;
}

int64_t Simulator::ForwardDuringMax(int first, int last) const {
  const int level = 31 - __builtin_clz(static_cast<unsigned>(last - first + 1));
  return std::max(forward_during_max_[level][first],
                  forward_during_max_[level][last - (1 << level) + 1]);
}

const char* ActionName(Action action) {
  switch (action) {
    case Action::kRetain:
      return "RETAIN";
    case Action::kRecompute:
      return "RECOMPUTE";
    case Action::kSwap:
      return "SWAP";
  }
  return "?";
}

const char* PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kMutwo:
      return "mutwo";
    case Policy::kSqrtN:
      return "sqrt_n";
    case Policy::kPerBlock:
      return "per_block";
    case Policy::kNone:
      return "none";
  }
  return "?";
}

bool PlanProfile::HasAllocatorFigures() const {
  for (const PlanNode& n : nodes) {
    if (n.allocated_bytes_after > 0 || n.peak_bytes_during > 0) return true;
  }
  for (const PlanBackwardStep& s : backward_steps) {
    if (s.allocated_bytes_after > 0 || s.peak_bytes_during > 0) return true;
  }
  return false;
}

Simulator::Simulator(const PlanProfile* profile) : profile_(profile) {}

absl::Status ValidatePlanProfile(const PlanProfile* profile) {
  if (profile == nullptr || profile->nodes.empty()) {
    return absl::InvalidArgumentError(
        "nodes: the profile has no forward nodes");
  }
  // Messages name the fields as the v1::Profile does (ProfileFromProto keeps
  // the order of activations and backward steps), so a bad reported profile
  // is refused naming what the worker sent.
  auto bad = [](const std::string& field, int64_t value,
                absl::string_view expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, ": ", expected));
  };
  const int n = static_cast<int>(profile->nodes.size());
  const int p = profile->positions();
  for (size_t k = 0; k < profile->backward_steps.size(); ++k) {
    const int f = profile->backward_steps[k].forward_node;
    if (f < -1 || f >= n) {
      return bad(absl::StrCat("backward_steps[", k, "].forward_node"), f,
                 absl::StrCat("must be -1 or a node id in [0, ", n, ")"));
    }
  }
  const int a_count = static_cast<int>(profile->activations.size());
  for (int i = 0; i < a_count; ++i) {
    const PlanActivation& a = profile->activations[i];
    // Formatted only on an error (this loop runs for every activation).
    auto field = [&](absl::string_view name) {
      return absl::StrCat("activations[", i, "] (value_id ", a.value_id, ").",
                          name);
    };
    if (a.producer_node < 0 || a.producer_node >= n) {
      return bad(field("producer_node"), a.producer_node,
                 absl::StrCat("must be a node id in [0, ", n, ")"));
    }
    if (a.size_bytes < 0) {
      return bad(field("size_bytes"), a.size_bytes, "must be >= 0");
    }
    if (a.last_forward_use < a.producer_node || a.last_forward_use >= n) {
      return bad(field("last_forward_use"), a.last_forward_use,
                 absl::StrCat("must be a forward position in [producer_node ",
                              a.producer_node, ", ", n, ")"));
    }
    if (a.first_backward_use < n || a.first_backward_use >= p) {
      return bad(
          field("first_backward_use"), a.first_backward_use,
          absl::StrCat("must be a backward position in [", n, ", ", p, ")"));
    }
    if (a.last_backward_use < a.first_backward_use ||
        a.last_backward_use >= p) {
      return bad(field("last_backward_use"), a.last_backward_use,
                 absl::StrCat("must be in [first_backward_use ",
                              a.first_backward_use, ", ", p, ")"));
    }
    for (int src : a.recompute_sources) {
      if (src < 0 || src >= a_count || src == i) {
        return bad(field("recompute_sources[]"), src,
                   absl::StrCat("must be another activation (index in [0, ",
                                a_count, "))"));
      }
    }
    int previous = -1;
    for (int node : a.recompute_nodes) {
      if (node < 0 || node >= n || node <= previous) {
        return bad(field("recompute_nodes[]"), node,
                   absl::StrCat("must be node ids in [0, ", n,
                                ") in increasing order"));
      }
      previous = node;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Simulator>> Simulator::Create(
    const PlanProfile* profile) {
  MUTWO_RETURN_IF_ERROR(ValidatePlanProfile(profile));
  const int n = static_cast<int>(profile->nodes.size());
  const int p = profile->positions();
  const int a_count = static_cast<int>(profile->activations.size());
  auto sim = std::unique_ptr<Simulator>(new Simulator(profile));
  sim->positions_ = p;
  sim->nodes_ = n;
  sim->step_ms_.resize(p);
  sim->end_ms_.resize(p);
  double t = 0;
  for (int i = 0; i < p; ++i) {
    sim->step_ms_[i] = i < n ? profile->nodes[i].forward_ms
                             : profile->backward_steps[i - n].ms;
    t += sim->step_ms_[i];
    sim->end_ms_[i] = t;
    if (i > 0 && !(sim->end_ms_[i] >= sim->end_ms_[i - 1])) {
      sim->monotone_time_ = false;
    }
  }
  sim->baseline_iteration_ms_ =
      profile->measured_iteration_ms > 0 ? profile->measured_iteration_ms : t;

  sim->base_after_.assign(p, 0);
  sim->base_during_.assign(p, 0);
  if (profile->HasAllocatorFigures()) {
    for (int i = 0; i < p; ++i) {
      const bool fw = i < n;
      sim->base_after_[i] =
          fw ? profile->nodes[i].allocated_bytes_after
             : profile->backward_steps[i - n].allocated_bytes_after;
      const int64_t during =
          fw ? profile->nodes[i].peak_bytes_during
             : profile->backward_steps[i - n].peak_bytes_during;
      const int64_t before =
          i > 0 ? sim->base_after_[i - 1] : sim->base_after_[i];
      sim->base_during_[i] = std::max({during, sim->base_after_[i], before});
    }
  } else {
    // No allocator figures: fixed memory plus every activation over its
    // lifetime [producer, last_backward_use].
    std::vector<int64_t> da(p + 1, 0), dd(p + 1, 0);
    for (const PlanActivation& a : profile->activations) {
      AddInterval(a.producer_node, a.last_backward_use, a.size_bytes, p - 1, da,
                  dd);
    }
    int64_t after = profile->fixed_bytes, during = profile->fixed_bytes;
    for (int i = 0; i < p; ++i) {
      after += da[i];
      during += dd[i];
      sim->base_after_[i] = after;
      sim->base_during_[i] = during;
    }
  }
  sim->baseline_peak_bytes_ =
      *std::max_element(sim->base_during_.begin(), sim->base_during_.end());
  sim->node_transient_.assign(n, 0);
  sim->forward_ms_before_.assign(n + 1, 0);
  sim->host_ms_before_.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    sim->node_transient_[i] = profile->nodes[i].transient_bytes;
    sim->forward_ms_before_[i + 1] =
        sim->forward_ms_before_[i] + profile->nodes[i].forward_ms;
    sim->host_ms_before_[i + 1] =
        sim->host_ms_before_[i] + profile->nodes[i].host_ms;
  }
  if (profile->HasAllocatorFigures() && n > 0) {
    auto& table = sim->forward_during_max_;
    table.emplace_back(sim->base_during_.begin(),
                       sim->base_during_.begin() + n);
    for (int width = 2; width <= n; width *= 2) {
      const std::vector<int64_t>& prev = table.back();
      std::vector<int64_t> next(n - width + 1);
      for (int i = 0; i + width <= n; ++i) {
        next[i] = std::max(prev[i], prev[i + width / 2]);
      }
      table.push_back(std::move(next));
    }
  }

  sim->produced_by_.resize(n);
  for (int i = 0; i < a_count; ++i) {
    sim->produced_by_[profile->activations[i].producer_node].push_back(i);
  }
  for (int i = 0; i < n; ++i) {
    if (profile->nodes[i].is_op) sim->op_nodes_.push_back(i);
  }
  sim->scratch_delta_after_.assign(p + 1, 0);
  sim->scratch_delta_during_.assign(p + 1, 0);
  sim->by_last_forward_use_.resize(a_count);
  for (int i = 0; i < a_count; ++i) sim->by_last_forward_use_[i] = i;
  std::stable_sort(sim->by_last_forward_use_.begin(),
                   sim->by_last_forward_use_.end(), [&](int x, int y) {
                     return profile->activations[x].last_forward_use <
                            profile->activations[y].last_forward_use;
                   });
  sim->scratch_node_stamp_.assign(n, -1);
  return sim;
}

double Simulator::transfer_in_ms(const PlanActivation& a) const {
  if (profile_->host_to_device_bytes_per_second > 0) {
    return 1000.0 * static_cast<double>(a.size_bytes) /
           profile_->host_to_device_bytes_per_second;
  }
  return a.swap_ms / 2;
}

double Simulator::transfer_out_ms(const PlanActivation& a) const {
  if (profile_->device_to_host_bytes_per_second > 0) {
    return 1000.0 * static_cast<double>(a.size_bytes) /
           profile_->device_to_host_bytes_per_second;
  }
  return a.swap_ms / 2;
}

SimResult Simulator::Run(const Decisions& decisions, Options options) const {
  SimResult r;
  Run(decisions, options, &r);
  return r;
}

void Simulator::Run(const Decisions& decisions, Options options,
                    SimResult* out) const {
  const int a_count = static_cast<int>(profile_->activations.size());
  MUTWO_DCHECK(static_cast<int>(decisions.size()) == a_count)
      << decisions.size() << " decisions for " << a_count << " activations";
  SimResult& r = *out;
  r.peak_bytes = 0;
  r.peak_position = 0;
  r.iteration_ms = r.recompute_ms = r.stall_ms = 0;
  r.recomputed = r.swapped = r.segments = 0;
  r.replays.clear();
  r.segment_of.assign(a_count, -1);
  r.needed_at.assign(a_count, -1);
  r.offload_done_at.assign(a_count, -1);
  r.stall_ms_of.assign(a_count, 0);
  r.segment_ms_of.assign(a_count, 0);

  BuildSegments(decisions, r);
  HoldSegmentInputs(r);
  QueueSwaps(decisions, r);
  SimulateMemory(decisions, options, r);
  r.timed = options.time_model;
  if (options.time_model && !scratch_swaps_.empty()) WalkTime(r);
  r.iteration_ms = baseline_iteration_ms_ + r.recompute_ms + r.stall_ms;
  r.baseline_during_bytes.clear();
  r.baseline_end_ms.clear();
  r.planned_end_ms.clear();
  if (options.record_curve) RecordTimeline(r);
}

void Simulator::BuildSegments(const Decisions& decisions, SimResult& r) const {
  const PlanProfile& prof = *profile_;
  // Recompute segments: maximal runs of op nodes whose activations are
  // recomputed; op nodes that produced no activation neither join nor split.
  std::vector<Segment>& segments = scratch_segments_;
  segments.clear();
  int current = -1;
  if (stamp_base_ > (1 << 30)) {
    std::fill(scratch_node_stamp_.begin(), scratch_node_stamp_.end(), -1);
    stamp_base_ = 0;
  }
  int stamp = 0;
  for (int node : op_nodes_) {
    const std::vector<int>& produced = produced_by_[node];
    if (produced.empty()) continue;
    bool recompute = false;
    for (int a : produced) {
      recompute |= decisions[a].action == Action::kRecompute;
    }
    if (!recompute) {
      current = -1;
      continue;
    }
    if (current < 0) {
      current = static_cast<int>(segments.size());
      segments.push_back(Segment{std::numeric_limits<int>::max(), 0, {}, {}});
      stamp = stamp_base_ + current;
    }
    Segment& seg = segments[current];
    for (int a : produced) {
      if (decisions[a].action != Action::kRecompute) continue;
      const PlanActivation& act = prof.activations[a];
      r.segment_of[a] = current;
      ++r.recomputed;
      seg.members.push_back({act.producer_node, act.size_bytes});
      seg.replay_at = std::min(seg.replay_at, act.first_backward_use);
      if (scratch_node_stamp_[act.producer_node] != stamp) {
        scratch_node_stamp_[act.producer_node] = stamp;
        seg.nodes.push_back(act.producer_node);
      }
      for (int rn : act.recompute_nodes) {
        if (scratch_node_stamp_[rn] != stamp) {
          scratch_node_stamp_[rn] = stamp;
          seg.nodes.push_back(rn);
        }
      }
    }
  }
  r.segments = static_cast<int>(segments.size());
  stamp_base_ += r.segments + 1;
  for (Segment& seg : segments) {
    std::sort(seg.nodes.begin(), seg.nodes.end());
    seg.ms = ReplayMs(seg.nodes);
    r.replays.emplace_back(seg.replay_at, seg.ms);
  }
}

void Simulator::HoldSegmentInputs(SimResult& r) const {
  const PlanProfile& prof = *profile_;
  const int a_count = static_cast<int>(prof.activations.size());
  const std::vector<Segment>& segments = scratch_segments_;
  // Segment inputs stay resident until the segment is replayed.
  std::vector<int>& hold = scratch_hold_until_;
  hold.assign(a_count, -1);
  std::vector<int>& first_need = scratch_first_need_;
  first_need.assign(a_count, std::numeric_limits<int>::max());
  for (int a = 0; a < a_count; ++a) {
    const int seg = r.segment_of[a];
    if (seg < 0) continue;
    r.needed_at[a] = segments[seg].replay_at;
    r.segment_ms_of[a] = segments[seg].ms;
    for (int s : prof.activations[a].recompute_sources) {
      if (r.segment_of[s] == seg) continue;
      hold[s] = std::max(hold[s], segments[seg].replay_at);
      first_need[s] = std::min(first_need[s], segments[seg].replay_at);
    }
  }
  for (const Segment& seg : segments) r.recompute_ms += seg.ms;
}

void Simulator::QueueSwaps(const Decisions& decisions, SimResult& r) const {
  const PlanProfile& prof = *profile_;
  const int a_count = static_cast<int>(prof.activations.size());
  const int p = positions_;
  const std::vector<int>& first_need = scratch_first_need_;
  // Swaps: offloads queue on one device->host stream in forward order.
  std::vector<int>& swaps = scratch_swaps_;
  swaps.clear();
  for (int a : by_last_forward_use_) {
    if (decisions[a].action == Action::kSwap) swaps.push_back(a);
  }
  r.swapped = static_cast<int>(swaps.size());
  std::vector<double>& offload_done_ms = scratch_offload_done_ms_;
  std::vector<int>& prefetch_at = scratch_prefetch_at_;
  if (!swaps.empty()) {
    offload_done_ms.assign(a_count, 0);
    prefetch_at.assign(a_count, -1);
    double d2h_free = 0;
    for (int a : swaps) {
      const PlanActivation& act = prof.activations[a];
      const double start = std::max(end_ms_[act.last_forward_use], d2h_free);
      const double done = start + transfer_out_ms(act);
      d2h_free = done;
      offload_done_ms[a] = done;
      auto it = std::lower_bound(end_ms_.begin() + act.last_forward_use,
                                 end_ms_.end(), done);
      r.offload_done_at[a] =
          it == end_ms_.end() ? p - 1 : static_cast<int>(it - end_ms_.begin());
      const int need = std::min(act.first_backward_use, first_need[a]);
      r.needed_at[a] = need;
      int pa = decisions[a].prefetch_at;
      if (pa < 0 || pa > need) pa = need;
      pa = prof.IssuePosition(pa);
      if (pa <= act.last_forward_use) pa = act.last_forward_use + 1;
      prefetch_at[a] = pa;
    }
  }
}

void Simulator::SimulateMemory(const Decisions& decisions, Options options,
                               SimResult& r) const {
  const PlanProfile& prof = *profile_;
  const int a_count = static_cast<int>(prof.activations.size());
  const int p = positions_;
  std::vector<Segment>& segments = scratch_segments_;
  const std::vector<int>& hold = scratch_hold_until_;
  const std::vector<int>& prefetch_at = scratch_prefetch_at_;
  // Memory: replace each changed activation's baseline interval by the
  // plan's residency intervals.
  std::vector<int64_t>& da = scratch_delta_after_;
  std::vector<int64_t>& dd = scratch_delta_during_;
  std::fill(da.begin(), da.end(), 0);
  std::fill(dd.begin(), dd.end(), 0);
  const int last = p - 1;
  for (int a = 0; a < a_count; ++a) {
    const Action action = decisions[a].action;
    if (action == Action::kRetain && hold[a] < 0) continue;
    const PlanActivation& act = prof.activations[a];
    const int64_t s = act.size_bytes;
    if (s == 0) continue;
    const int end = std::max(act.last_backward_use, hold[a]);
    AddInterval(act.producer_node, act.last_backward_use, -s, last, da, dd);
    int release_after = -1, back_at = -1;
    if (action == Action::kRecompute && r.segment_of[a] >= 0) {
      // (A RECOMPUTE produced by a non-op node belongs to no segment: the
      // executor cannot replay it, so it stays resident.)
      release_after = std::max(act.last_forward_use, hold[a]);
      back_at = segments[r.segment_of[a]].replay_at;
    } else if (action == Action::kSwap) {
      release_after = r.offload_done_at[a];
      back_at = prefetch_at[a];
    }
    if (release_after >= 0 && release_after + 1 < back_at) {
      AddInterval(act.producer_node, release_after, s, last, da, dd);
      AddInterval(back_at, end, s, last, da, dd);
    } else {
      AddInterval(act.producer_node, end, s, last, da, dd);
    }
  }
  // A replay's ops run again at its position, their transients on top of
  // what the segment rebuilt so far (bounded by all of it, counted above).
  for (Segment& seg : segments) {
    if (seg.replay_at > last) continue;
    const int64_t excess = replay_transient_excess(
        ReplayTransient(seg.members, seg.nodes), seg.replay_at);
    if (excess <= 0) continue;
    dd[seg.replay_at] += excess;
    dd[seg.replay_at + 1] -= excess;
  }
  int64_t delta_during = 0, delta_after = 0;
  r.peak_bytes = std::numeric_limits<int64_t>::min();
  r.baseline_after_bytes.clear();
  r.planned_after_bytes.clear();
  r.planned_peak_bytes.resize(p);
  if (options.record_curve) {
    r.baseline_after_bytes = base_after_;
    r.planned_after_bytes.resize(p);
  }
  for (int t = 0; t < p; ++t) {
    delta_during += dd[t];
    const int64_t during = base_during_[t] + delta_during;
    r.planned_peak_bytes[t] = during;
    if (during > r.peak_bytes) {
      r.peak_bytes = during;
      r.peak_position = t;
    }
  }
  // What a plan frees is what the baseline held: the curve never goes
  // below zero, so neither does its peak.
  MUTWO_DCHECK(p == 0 || r.peak_bytes >= 0)
      << "simulated peak " << r.peak_bytes << " B at position "
      << r.peak_position;
  if (options.record_curve) {
    for (int t = 0; t < p; ++t) {
      delta_after += da[t];
      r.planned_after_bytes[t] = base_after_[t] + delta_after;
    }
  }
}

void Simulator::WalkTime(SimResult& r) const {
  const PlanProfile& prof = *profile_;
  const int a_count = static_cast<int>(prof.activations.size());
  const int p = positions_;
  const std::vector<int>& swaps = scratch_swaps_;
  const std::vector<int>& prefetch_at = scratch_prefetch_at_;
  const std::vector<double>& offload_done_ms = scratch_offload_done_ms_;
  std::vector<int> by_issue = swaps, by_need = swaps;
  std::sort(by_issue.begin(), by_issue.end(), [&](int x, int y) {
    return prefetch_at[x] != prefetch_at[y] ? prefetch_at[x] < prefetch_at[y]
                                            : r.needed_at[x] < r.needed_at[y];
  });
  std::sort(by_need.begin(), by_need.end(),
            [&](int x, int y) { return r.needed_at[x] < r.needed_at[y]; });
  std::vector<std::pair<int, double>> replays = r.replays;
  std::sort(replays.begin(), replays.end());
  std::vector<double> ready_ms(a_count, 0);
  double now = 0, h2d_free = 0;
  size_t i_issue = 0, i_need = 0, i_replay = 0;
  for (int t = 0; t < p && i_need < by_need.size(); ++t) {
    for (; i_issue < by_issue.size() && prefetch_at[by_issue[i_issue]] == t;
         ++i_issue) {
      const int a = by_issue[i_issue];
      const double start = std::max({now, h2d_free, offload_done_ms[a]});
      h2d_free = start + transfer_in_ms(prof.activations[a]);
      ready_ms[a] = h2d_free;
    }
    for (; i_need < by_need.size() && r.needed_at[by_need[i_need]] == t;
         ++i_need) {
      const int a = by_need[i_need];
      if (ready_ms[a] > now) {
        r.stall_ms_of[a] = ready_ms[a] - now;
        r.stall_ms += ready_ms[a] - now;
        now = ready_ms[a];
      }
    }
    for (; i_replay < replays.size() && replays[i_replay].first == t;
         ++i_replay) {
      now += replays[i_replay].second;
    }
    now += step_ms_[t];
  }
}

void Simulator::RecordTimeline(SimResult& r) const {
  const int a_count = static_cast<int>(profile_->activations.size());
  const int p = positions_;
  r.baseline_during_bytes = base_during_;
  r.baseline_end_ms = end_ms_;
  // What the time walk adds before each position's step: stalls (at the
  // position an activation is needed) and segment replays.
  std::vector<double> extra_ms(p, 0);
  for (const auto& [position, ms] : r.replays) {
    if (position >= 0 && position < p) extra_ms[position] += ms;
  }
  for (int a = 0; a < a_count; ++a) {
    const int t = r.needed_at[a];
    if (r.stall_ms_of[a] > 0 && t >= 0 && t < p) {
      extra_ms[t] += r.stall_ms_of[a];
    }
  }
  r.planned_end_ms.resize(p);
  double now = 0;
  for (int t = 0; t < p; ++t) {
    now += extra_ms[t] + step_ms_[t];
    r.planned_end_ms[t] = now;
  }
}

}  // namespace mutwo::planner
