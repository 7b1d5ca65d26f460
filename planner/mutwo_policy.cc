#include "planner/mutwo_policy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/candidate_index.h"
#include "planner/incremental_simulator.h"
#include "planner/lineage.h"

namespace mutwo::planner {

using State = Lineage::State;

absl::StatusOr<std::unique_ptr<MutwoPolicy>> MutwoPolicy::Create(
    const Simulator* simulator, Options options) {
  if (simulator == nullptr) {
    return absl::InvalidArgumentError("MutwoPolicy needs a simulator");
  }
  if (!options.seed.empty()) {
    if (options.seed.size() != simulator->profile().activations.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MutwoPolicy seed has ", options.seed.size(),
          " decisions; the profile has ",
          simulator->profile().activations.size(), " activations"));
    }
    for (size_t c = 0; c < options.seed.size(); ++c) {
      if (options.seed[c].action == Action::kSwap) {
        return absl::InvalidArgumentError(
            absl::StrCat("MutwoPolicy seed[", c,
                         "] is SWAP: seeds may only RETAIN or RECOMPUTE"));
      }
    }
  }
  std::unique_ptr<MutwoPolicy> policy(
      new MutwoPolicy(simulator, std::move(options)));
  MUTWO_RETURN_IF_ERROR(policy->Reset());
  return policy;
}

MutwoPolicy::MutwoPolicy(const Simulator* simulator, Options options)
    : sim_(simulator), options_(std::move(options)) {
  incremental_ = options_.incremental && !options_.refine &&
                 !options_.time_each_step && sim_->monotone_time();
}

bool MutwoPolicy::StoppedAt(size_t i) {
  if (options_.interrupt == nullptr || i % 1024 != 0 ||
      !options_.interrupt->Stopped()) {
    return false;
  }
  done_ = true;
  return true;
}

MutwoPolicy::~MutwoPolicy() = default;

absl::Status MutwoPolicy::Reset() {
  const int n = static_cast<int>(sim_->profile().activations.size());
  done_ = false;
  decisions_.assign(n, Decision{});
  if (StoppedAt(0)) return options_.interrupt->status();
  lineage_ = std::make_unique<Lineage>(*sim_);
  if (!options_.seed.empty()) {
    // In activation order, as the lineage would have seen them chosen one by
    // one; activations the lineage never offers keep their seed decision.
    decisions_ = options_.seed;
    for (int c = 0; c < n; ++c) {
      if (StoppedAt(c)) return options_.interrupt->status();
      if (decisions_[c].action == Action::kRecompute &&
          lineage_->state(c) == State::kCandidate) {
        lineage_->Recompute(c, /*refresh=*/false);
      }
    }
    if (StoppedAt(0)) return options_.interrupt->status();
    lineage_->RefreshAll();
  }
  if (StoppedAt(0)) return options_.interrupt->status();
  no_swap_.assign(n, 0);
  for (int c = 0; c < n; ++c) {
    no_swap_[c] = sim_->profile().activations[c].swappable ? 0 : 1;
  }
  no_recompute_.assign(n, 0);
  remaining_.clear();
  for (int c = 0; c < n; ++c) {
    if (lineage_->state(c) == State::kCandidate) remaining_.push_back(c);
  }
  swapped_.clear();
  if (incremental_) return ResetIncremental();
  replay_ms_.assign(sim_->positions(), 0);
  sim_options_.time_model = options_.time_each_step;
  sim_->Run(decisions_, sim_options_, &current_);
  return absl::OkStatus();
}

absl::Status MutwoPolicy::ResetIncremental() {
  const PlanProfile& prof = sim_->profile();
  const int n = static_cast<int>(prof.activations.size());
  const int p = sim_->positions();
  if (inc_ == nullptr) {
    inc_ = *IncrementalSimulator::Create(sim_);
  } else {
    inc_->Reset();
  }
  // The seed, in bit-reversed index order: the state does not depend on the
  // order, and this one merges recompute runs of similar lengths instead of
  // growing each run one activation at a time (quadratic in its length).
  int bits = 0;
  while ((1 << bits) < n) ++bits;
  for (int i = 0; i < (1 << bits); ++i) {
    if (StoppedAt(i)) return options_.interrupt->status();
    int c = 0;
    for (int b = 0; b < bits; ++b) c |= ((i >> b) & 1) << (bits - 1 - b);
    if (c < n && decisions_[c].action != Action::kRetain) {
      inc_->Set(c, decisions_[c]);
    }
  }
  lineage_->TrackRefreshed(&refreshed_);
  swap_index_ = std::make_unique<CandidateIndex>(p);
  recompute_index_ = std::make_unique<CandidateIndex>(p);
  in_remaining_.assign(n, 0);
  recompute_key_.assign(n, 0);
  swap_rank_.assign(n, -1);
  const bool swap_ok = options_.allow_swap && prof.CanSwap();
  const std::vector<double>& end_ms = sim_->baseline_end_times_ms();
  std::vector<CandidateIndex::Item> swap_items, recompute_items;
  for (size_t i = 0; i < remaining_.size(); ++i) {
    if (StoppedAt(i)) return options_.interrupt->status();
    const int c = remaining_[i];
    in_remaining_[c] = 1;
    const PlanActivation& a = prof.activations[c];
    recompute_key_[c] = RecomputeKey(c);
    if (options_.allow_recompute && recompute_key_[c] > -1 &&
        a.last_forward_use + 1 <= a.first_backward_use - 1) {
      recompute_items.push_back({a.last_forward_use + 1,
                                 a.first_backward_use - 1, recompute_key_[c],
                                 c});
    }
    // Swap: inactive at the position and the offload can finish before it
    // starts; the latter holds from the first position q whose start is
    // late enough (start times never decrease), found with the scan's own
    // expression.
    if (!swap_ok || !(a.inactive_ms > -1)) continue;
    const double out_ms = sim_->transfer_out_ms(a);
    int lo = a.last_forward_use + 1, hi = a.first_backward_use;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (end_ms[mid - 1] - end_ms[a.last_forward_use] >= out_ms) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    if (lo <= a.first_backward_use - 1) {
      swap_items.push_back({lo, a.first_backward_use - 1, a.inactive_ms, c});
    }
  }
  swap_index_->Build(swap_items);
  recompute_index_->Build(recompute_items);
  return absl::OkStatus();
}

double MutwoPolicy::RecomputeKey(int c) const {
  // The scan's expression, so that equal totals give equal keys.
  const double total = std::max(lineage_->total(c), 1e-9);
  return options_.order == Options::Order::kRatio
             ? static_cast<double>(sim_->profile().activations[c].size_bytes) /
                   total
             : 1.0 / total;
}

void MutwoPolicy::UpdateRecomputeKey(int c) {
  const double key = RecomputeKey(c);
  const double indexed = recompute_key_[c];
  recompute_key_[c] = key;
  // A lower key is re-queued lazily by the index (the usual case: totals
  // only grow); a higher one must be indexed again.
  if (!(key <= indexed)) {
    const PlanActivation& a = sim_->profile().activations[c];
    if (a.last_forward_use + 1 <= a.first_backward_use - 1) {
      recompute_index_->Add(a.last_forward_use + 1, a.first_backward_use - 1,
                            key, c);
    }
  }
}

int64_t MutwoPolicy::peak_bytes() const {
  return incremental_ ? inc_->peak_bytes() : current_.peak_bytes;
}

Decisions MutwoPolicy::Run(int64_t budget_bytes,
                           std::vector<TrajectoryStep>* trajectory) {
  // Interrupted: the decisions the rebuild stopped at (Step finds nothing).
  if (!Reset().ok()) return decisions_;
  TrajectoryStep step;
  while (peak_bytes() > budget_bytes && Step(&step)) {
    if (trajectory != nullptr) trajectory->push_back(step);
  }
  return decisions_;
}

bool MutwoPolicy::IncrementalStep(TrajectoryStep* out) {
  const PlanProfile& prof = sim_->profile();
  const bool swap_ok = options_.allow_swap && prof.CanSwap();
  Lineage& lineage = *lineage_;
  IncrementalSimulator& inc = *inc_;
  auto valid_swap = [&](int c) { return in_remaining_[c] && !no_swap_[c]; };
  auto inactive = [&](int c) { return prof.activations[c].inactive_ms; };
  // (A NaN key never wins the scan's strict ">".)
  auto valid_recompute = [&](int c) {
    return in_remaining_[c] && !no_recompute_[c] && recompute_key_[c] > -1;
  };
  auto ratio = [&](int c) { return recompute_key_[c]; };
  while (!done_) {
    const int pp = inc.peak_position();
    const int64_t peak = inc.peak_bytes();
    const int s_cand =
        swap_ok ? swap_index_->Best(pp, valid_swap, inactive) : -1;
    const int r_cand = options_.allow_recompute
                           ? recompute_index_->Best(pp, valid_recompute, ratio)
                           : -1;
    if (s_cand < 0 && r_cand < 0) {
      // No candidate left at this peak: rebuild a swapped activation that
      // is still resident there (its offload, queued behind the others,
      // ends after it) by recomputation.
      const int c =
          ResidentSwap(pp, [&](int w) { return inc.offload_done_at(w); });
      if (c < 0) {
        done_ = true;
        break;
      }
      const Decision swap = decisions_[c];
      inc.Set(c, Decision{Action::kRecompute, -1});
      if (inc.peak_bytes() > peak || inc.planned_peak_bytes(pp) >= peak) {
        inc.Set(c, swap);
        no_recompute_[c] = 1;
        continue;
      }
      *out = AcceptSwapToRecompute(c, inc.peak_bytes(), inc.iteration_ms());
      return true;
    }

    // Algorithm C, as in Step().
    double s_overhead = 0;
    int prefetch_at = -1;
    if (s_cand >= 0) {
      const PlanActivation& a = prof.activations[s_cand];
      const double in_ms = sim_->transfer_in_ms(a);
      const int need = a.first_backward_use;
      double hidden = inc.replay_ms_at(need);
      int t = need - 1;
      while (hidden < in_ms && t > a.last_forward_use && t > pp &&
             inc.planned_peak_bytes(t) < peak) {
        hidden += sim_->step_ms(t) + inc.replay_ms_at(t);
        --t;
      }
      prefetch_at = t + 1;
      // Transfers already due in the window, summed in the order of
      // swapped_ as the scan does.
      queued_.clear();
      for (int t2 = prefetch_at; t2 <= need; ++t2) {
        for (int w : inc.swaps_needed_at(t2)) {
          queued_.emplace_back(swap_rank_[w], w);
        }
      }
      std::sort(queued_.begin(), queued_.end());
      double queued = 0;
      for (const auto& [rank, w] : queued_) {
        queued += sim_->transfer_in_ms(prof.activations[w]);
      }
      s_overhead = std::max(0.0, in_ms + queued - hidden);
    }
    const double r_overhead = r_cand >= 0 ? lineage.total(r_cand) : 0;
    const bool take_swap =
        s_cand >= 0 && (r_cand < 0 || s_overhead < r_overhead);
    const int cand = take_swap ? s_cand : r_cand;
    Decision decision;
    decision.action = take_swap ? Action::kSwap : Action::kRecompute;
    decision.prefetch_at = take_swap ? prefetch_at : -1;
    inc.Set(cand, decision);
    // A swap whose offload, queued behind the others, completes after the
    // peak position does not lower it: undone like a choice that raises the
    // peak (it stays a recompute candidate).
    if (inc.peak_bytes() > peak ||
        (take_swap && inc.planned_peak_bytes(pp) >= peak)) {
      inc.Set(cand, Decision{});
      (take_swap ? no_swap_ : no_recompute_)[cand] = 1;
      continue;
    }
    decisions_[cand] = decision;
    in_remaining_[cand] = 0;
    refreshed_.clear();
    if (take_swap) {
      lineage.Swap(cand);
      swap_rank_[cand] = static_cast<int>(swapped_.size());
      swapped_.push_back(cand);
    } else {
      lineage.Recompute(cand);
    }
    if (options_.allow_recompute) {
      for (int c : refreshed_) {
        if (in_remaining_[c] && !no_recompute_[c]) UpdateRecomputeKey(c);
      }
    }
    TrajectoryStep step;
    step.activation = cand;
    step.action = decision.action;
    step.prefetch_at = decision.prefetch_at;
    step.estimated_overhead_ms = take_swap ? s_overhead : r_overhead;
    step.peak_bytes = inc.peak_bytes();
    step.iteration_ms = inc.iteration_ms();
    *out = std::move(step);
    return true;
  }
  return false;
}

bool MutwoPolicy::Step(TrajectoryStep* out) {
  if (incremental_) return IncrementalStep(out);
  const PlanProfile& prof = sim_->profile();
  const int n = static_cast<int>(prof.activations.size());
  const bool swap_ok = options_.allow_swap && prof.CanSwap();
  Decisions& decisions = decisions_;
  Lineage& lineage = *lineage_;
  SimResult& current = current_;
  while (!done_) {
    const int pp = current.peak_position;
    int s_cand = -1, r_cand = -1;
    double best_inactive = -1, best_ratio = -1;
    const double pp_start_ms = pp > 0 ? sim_->baseline_end_ms(pp - 1) : 0;
    for (int c : remaining_) {
      const PlanActivation& a = prof.activations[c];
      if (!(a.last_forward_use < pp && pp < a.first_backward_use)) continue;
      if (swap_ok && !no_swap_[c] && a.inactive_ms > best_inactive) {
        // The offload must complete before the peak to lower it.
        const double window =
            pp_start_ms - sim_->baseline_end_ms(a.last_forward_use);
        if (window >= sim_->transfer_out_ms(a)) {
          best_inactive = a.inactive_ms;
          s_cand = c;
        }
      }
      if (options_.allow_recompute && !no_recompute_[c]) {
        const double ratio = options_.order == Options::Order::kRatio
                                 ? static_cast<double>(a.size_bytes) /
                                       std::max(lineage.total(c), 1e-9)
                                 : 1.0 / std::max(lineage.total(c), 1e-9);
        if (ratio > best_ratio) {
          best_ratio = ratio;
          r_cand = c;
        }
      }
    }
    if (s_cand < 0 && r_cand < 0) {
      // As in IncrementalStep().
      const int c =
          ResidentSwap(pp, [&](int w) { return current.offload_done_at[w]; });
      if (c < 0) {
        done_ = true;
        break;
      }
      const Decision swap = decisions[c];
      decisions[c] = Decision{Action::kRecompute, -1};
      sim_->Run(decisions, sim_options_, &next_);
      if (next_.peak_bytes > current.peak_bytes ||
          next_.planned_peak_bytes[pp] >= current.peak_bytes) {
        decisions[c] = swap;
        no_recompute_[c] = 1;
        continue;
      }
      std::swap(current, next_);
      TrajectoryStep step = AcceptSwapToRecompute(c, 0, 0);
      if (options_.refine) {
        Refine(decisions, c, current, step.retained_again);
        for (int r : step.retained_again) {
          lineage.Forget(r);
          swapped_.erase(std::remove(swapped_.begin(), swapped_.end(), r),
                         swapped_.end());
        }
      }
      step.peak_bytes = current.peak_bytes;
      step.iteration_ms = current.iteration_ms;
      *out = std::move(step);
      return true;
    }

    // Algorithm C: walk back from the first backward use, hiding the
    // prefetch behind backward steps and replays.
    double s_overhead = 0;
    int prefetch_at = -1;
    if (s_cand >= 0) {
      std::fill(replay_ms_.begin(), replay_ms_.end(), 0);
      for (const auto& [at, ms] : current.replays) replay_ms_[at] += ms;
      const PlanActivation& a = prof.activations[s_cand];
      const double in_ms = sim_->transfer_in_ms(a);
      const int need = a.first_backward_use;
      double hidden = replay_ms_[need];
      int t = need - 1;
      // The candidate is resident in the current plan over the window, so
      // the prefetch adds nothing there; it must not reach a position at the
      // current peak, or the peak could not drop (the paper's peak interval).
      while (hidden < in_ms && t > a.last_forward_use && t > pp &&
             current.planned_peak_bytes[t] < current.peak_bytes) {
        hidden += sim_->step_ms(t) + replay_ms_[t];
        --t;
      }
      prefetch_at = t + 1;
      double queued = 0;  // transfers already due in the same window
      for (int w : swapped_) {
        const int w_need = current.needed_at[w];
        if (w_need >= prefetch_at && w_need <= need) {
          queued += sim_->transfer_in_ms(prof.activations[w]);
        }
      }
      s_overhead = std::max(0.0, in_ms + queued - hidden);
    }
    const double r_overhead = r_cand >= 0 ? lineage.total(r_cand) : 0;
    const bool take_swap =
        s_cand >= 0 && (r_cand < 0 || s_overhead < r_overhead);
    const int cand = take_swap ? s_cand : r_cand;
    decisions[cand].action = take_swap ? Action::kSwap : Action::kRecompute;
    decisions[cand].prefetch_at = take_swap ? prefetch_at : -1;

    sim_->Run(decisions, sim_options_, &next_);
    if (next_.peak_bytes > current.peak_bytes ||
        (take_swap && next_.planned_peak_bytes[pp] >= current.peak_bytes)) {
      decisions[cand] = Decision{};
      (take_swap ? no_swap_ : no_recompute_)[cand] = 1;
      continue;
    }
    remaining_.erase(std::find(remaining_.begin(), remaining_.end(), cand));
    if (take_swap) {
      lineage.Swap(cand);
      swapped_.push_back(cand);
    } else {
      lineage.Recompute(cand);
    }
    std::swap(current, next_);
    TrajectoryStep step;
    step.activation = cand;
    step.action = decisions[cand].action;
    step.prefetch_at = decisions[cand].prefetch_at;
    step.estimated_overhead_ms = take_swap ? s_overhead : r_overhead;
    if (options_.refine) {
      Refine(decisions, cand, current, step.retained_again);
      for (int c : step.retained_again) {
        lineage.Forget(c);
        swapped_.erase(std::remove(swapped_.begin(), swapped_.end(), c),
                       swapped_.end());
      }
    }
    step.peak_bytes = current.peak_bytes;
    step.iteration_ms = current.iteration_ms;
    *out = std::move(step);
    return true;
  }
  return false;
}

void MutwoPolicy::Refine(Decisions& decisions, int just_chosen,
                         SimResult& current,
                         std::vector<int>& retained_again) const {
  std::vector<std::pair<double, int>> chosen;
  for (size_t a = 0; a < decisions.size(); ++a) {
    if (decisions[a].action == Action::kRetain ||
        static_cast<int>(a) == just_chosen) {
      continue;
    }
    const double cost = decisions[a].action == Action::kRecompute
                            ? current.segment_ms_of[a]
                            : current.stall_ms_of[a];
    chosen.emplace_back(-cost, static_cast<int>(a));
  }
  std::sort(chosen.begin(), chosen.end());
  bool stale = false;
  for (const auto& [neg_cost, a] : chosen) {
    const Decision kept = decisions[a];
    decisions[a] = Decision{};
    SimResult next = sim_->Run(decisions);
    if (next.peak_bytes <= current.peak_bytes &&
        next.iteration_ms <= current.iteration_ms) {
      current = std::move(next);
      retained_again.push_back(a);
      stale = false;
    } else {
      decisions[a] = kept;
      stale = true;
    }
  }
  if (stale) current = sim_->Run(decisions);
}

template <typename OffloadDoneAt>
int MutwoPolicy::ResidentSwap(int pp,
                              const OffloadDoneAt& offload_done_at) const {
  if (!options_.allow_recompute) return -1;
  const PlanProfile& prof = sim_->profile();
  int best = -1;
  double best_key = -1;
  for (int c : swapped_) {
    const PlanActivation& a = prof.activations[c];
    if (no_recompute_[c] || !a.recomputable ||
        !prof.nodes[a.producer_node].is_op || a.size_bytes <= 0 ||
        !(a.last_forward_use < pp && pp < a.first_backward_use) ||
        offload_done_at(c) <= pp) {
      continue;
    }
    const double key = RecomputeKey(c);
    if (key > best_key) {
      best_key = key;
      best = c;
    }
  }
  return best;
}

TrajectoryStep MutwoPolicy::AcceptSwapToRecompute(int c, int64_t peak_bytes,
                                                  double iteration_ms) {
  decisions_[c] = Decision{Action::kRecompute, -1};
  swapped_.erase(std::find(swapped_.begin(), swapped_.end(), c));
  refreshed_.clear();
  lineage_->SwapToRecompute(c);
  if (incremental_) {
    for (int r : refreshed_) {
      if (in_remaining_[r] && !no_recompute_[r]) UpdateRecomputeKey(r);
    }
  }
  TrajectoryStep step;
  step.activation = c;
  step.action = Action::kRecompute;
  step.estimated_overhead_ms = lineage_->total(c);
  step.peak_bytes = peak_bytes;
  step.iteration_ms = iteration_ms;
  return step;
}

Decisions DecisionsAfter(int activation_count,
                         const std::vector<TrajectoryStep>& trajectory,
                         size_t steps) {
  return DecisionsAfter(Decisions(activation_count), trajectory, steps);
}

Decisions DecisionsAfter(const Decisions& seed,
                         const std::vector<TrajectoryStep>& trajectory,
                         size_t steps) {
  Decisions d = seed;
  for (size_t i = 0; i < steps && i < trajectory.size(); ++i) {
    d[trajectory[i].activation].action = trajectory[i].action;
    d[trajectory[i].activation].prefetch_at = trajectory[i].prefetch_at;
    for (int a : trajectory[i].retained_again) d[a] = Decision{};
  }
  return d;
}

}  // namespace mutwo::planner
