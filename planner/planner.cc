#include "planner/planner.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/baselines.h"
#include "planner/replay_closure.h"

namespace mutwo::planner {
namespace {

constexpr int64_t kNoFit = std::numeric_limits<int64_t>::min();

}  // namespace

absl::StatusOr<std::unique_ptr<Planner>> Planner::Create(PlanProfile profile,
                                                         Options options) {
  auto planner =
      std::unique_ptr<Planner>(new Planner(std::move(profile), options));
  MUTWO_ASSIGN_OR_RETURN(planner->sim_, Simulator::Create(&planner->profile_));
  const PlanProfile& prof = planner->profile_;
  const bool small = static_cast<int>(prof.activations.size()) <=
                     options.small_graph_activations;
  planner->small_ = small;
  switch (options.policy) {
    case Policy::kMutwo:
      break;
    case Policy::kNone:
      planner->fixed_decisions_ = NoCheckpointing(prof);
      break;
    case Policy::kSqrtN:
      planner->fixed_decisions_ = SqrtNCheckpointing(prof);
      break;
    case Policy::kPerBlock:
      planner->fixed_decisions_ = PerBlockCheckpointing(prof);
      break;
  }
  if (options.policy != Policy::kMutwo) return planner;

  // The trajectories (see the header): every one is budget-independent, so
  // each is run at most once, down to its floor. `greedy` off: the seed is
  // the track's only state. `refine`: on small graphs, refinement after
  // every step (a simulation per chosen activation).
  auto add_track = [&](MutwoPolicy::Options::Order order, bool allow_swap,
                       Decisions seed, int64_t seed_peak_bytes, bool greedy,
                       bool refine) -> absl::Status {
    Track track;
    track.seed_peak_bytes = seed_peak_bytes;
    if (greedy) {
      MutwoPolicy::Options policy_options;
      policy_options.allow_swap = allow_swap;
      policy_options.order = order;
      policy_options.refine = small && refine;
      policy_options.time_each_step = small;
      policy_options.incremental = options.incremental;
      policy_options.seed = seed;
      policy_options.interrupt = options.interrupt;
      MUTWO_ASSIGN_OR_RETURN(
          track.policy,
          MutwoPolicy::Create(planner->sim_.get(), std::move(policy_options)));
    } else {
      track.exhausted = true;
    }
    track.seed =
        seed.empty() ? Decisions(prof.activations.size()) : std::move(seed);
    planner->tracks_.push_back(std::move(track));
    return absl::OkStatus();
  };
  using Order = MutwoPolicy::Options::Order;
  const int64_t base = planner->sim_->baseline_peak_bytes();
  MUTWO_RETURN_IF_ERROR(
      add_track(Order::kRatio, options.allow_swap, {}, base, true, true));
  if (small) {
    MUTWO_RETURN_IF_ERROR(
        add_track(Order::kCheapest, options.allow_swap, {}, base, true, true));
  }
  // With swaps offered, every greedy track also runs without them, as the
  // planner of a profile that cannot swap runs it: offering swaps never
  // raises the floor. Swaps are chosen while their estimated stall is below
  // the next recomputation's cost, and a swapped activation stays resident
  // from its prefetch on: the paper's trajectory can stop far above what
  // recomputation alone reaches (ResNet-152 on a GPU), and the CPU apply
  // tier's ViTs and ConvNeXt with a modeled 1 GB/s link had floors 0.4-2.7%
  // above their floors without it.
  const bool swaps = options.allow_swap && prof.CanSwap();
  if (swaps) {
    MUTWO_RETURN_IF_ERROR(
        add_track(Order::kRatio, false, {}, base, true, true));
    if (small) {
      MUTWO_RETURN_IF_ERROR(
          add_track(Order::kCheapest, false, {}, base, true, true));
    }
  }
  // The fixed checkpointing schedules are candidates of their own, so the
  // floor is never above theirs nor a plan slower than one of them that
  // fits; the one with the lowest peak (small graphs: each) is also taken
  // further down by the greedy. Refinement from the other seed would cost a
  // simulation per seeded recomputation at every step.
  const Decisions none = NoCheckpointing(prof);
  Simulator::Options memory_only;
  memory_only.time_model = false;
  std::vector<std::pair<int64_t, Decisions>> seeds;
  for (Decisions seed :
       {SqrtNCheckpointing(prof), PerBlockCheckpointing(prof)}) {
    auto same = [&](const Decisions& other) {
      for (size_t a = 0; a < seed.size(); ++a) {
        if (seed[a].action != other[a].action) return false;
      }
      return true;
    };
    if (same(none) ||
        std::any_of(seeds.begin(), seeds.end(),
                    [&](const auto& other) { return same(other.second); })) {
      continue;
    }
    const int64_t peak = planner->sim_->Run(seed, memory_only).peak_bytes;
    seeds.emplace_back(peak, std::move(seed));
  }
  std::stable_sort(
      seeds.begin(), seeds.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < seeds.size(); ++i) {
    if (swaps && (small || i == 0)) {
      MUTWO_RETURN_IF_ERROR(add_track(Order::kRatio, false, seeds[i].second,
                                      seeds[i].first, true, i == 0));
    }
    MUTWO_RETURN_IF_ERROR(add_track(Order::kRatio, options.allow_swap,
                                    std::move(seeds[i].second), seeds[i].first,
                                    small || i == 0, i == 0));
  }
  return planner;
}

void Planner::Extend(int order, int64_t peak_bytes) {
  Track& track = tracks_[order];
  TrajectoryStep step;
  while (!track.exhausted &&
         (track.steps.empty() ? track.seed_peak_bytes
                              : track.steps.back().peak_bytes) > peak_bytes &&
         !Interrupted()) {
    if (track.policy->Step(&step)) {
      track.steps.push_back(std::move(step));
    } else {
      track.exhausted = true;
    }
  }
}

int Planner::FirstFit(int order, int64_t budget_bytes) {
  Extend(order, budget_bytes);
  const Track& track = tracks_[order];
  for (int i = -1; i < static_cast<int>(track.steps.size()); ++i) {
    if (StatePeak(track, i) <= budget_bytes) return i;
  }
  return -2;
}

int64_t Planner::ClosedPeak(int order, int index) {
  auto [it, added] = closed_peak_.try_emplace({order, index}, 0);
  if (added) {
    Simulator::Options memory_only;
    memory_only.time_model = false;
    const Decisions decisions = StateDecisions(tracks_[order], index);
    const SimResult plain = sim_->Run(decisions, memory_only);
    const Decisions closed = CloseOverReplays(profile_, decisions, plain);
    it->second = closed == decisions
                     ? plain.peak_bytes
                     : std::min(plain.peak_bytes,
                                sim_->Run(closed, memory_only).peak_bytes);
  }
  return it->second;
}

int Planner::ClosedFirstFit(int order, int64_t budget_bytes) {
  const int fit = FirstFit(order, budget_bytes);
  if (fit < -1) return fit;
  // ClosedPeak(fit) <= StatePeak(fit) <= budget: search [-1, fit].
  int lo = -1, hi = fit;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (ClosedPeak(order, mid) <= budget_bytes) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return hi;
}

const std::vector<TrajectoryStep>& Planner::Trajectory(int order) {
  static const std::vector<TrajectoryStep>* const kEmpty =
      new std::vector<TrajectoryStep>();
  if (order < 0 || order >= orders()) return *kEmpty;
  Extend(order, std::numeric_limits<int64_t>::min());
  return tracks_[order].steps;
}

int64_t Planner::FloorBytes() {
  if (options_.policy != Policy::kMutwo) {
    if (!fixed_.has_value()) fixed_ = sim_->Run(fixed_decisions_);
    return fixed_->peak_bytes;
  }
  int64_t floor = sim_->baseline_peak_bytes();
  for (int order = 0; order < orders(); ++order) {
    floor = std::min(floor, tracks_[order].seed_peak_bytes);
    for (const TrajectoryStep& step : Trajectory(order)) {
      floor = std::min(floor, step.peak_bytes);
    }
  }
  return floor;
}

void Planner::Improve(int64_t budget_bytes, Candidate& c) {
  Decisions& d = c.decisions;
  SimResult current = sim_->Run(d);
  ++c.simulations;
  auto budget_left = [&] {
    if (c.simulations < options_.max_improve_simulations && !Interrupted()) {
      return true;
    }
    c.bounded = true;
    return false;
  };
  // Accepts the simulated change when it fits and adds no time; the budget
  // test is the only one that depends on the budget, and an accepted peak
  // raises the critical budget.
  auto try_change = [&](bool strictly_faster) {
    SimResult next = sim_->Run(d);
    ++c.simulations;
    const bool faster = strictly_faster
                            ? next.iteration_ms < current.iteration_ms - 1e-9
                            : next.iteration_ms <= current.iteration_ms;
    if (next.peak_bytes <= budget_bytes && faster) {
      c.critical_bytes = std::max(c.critical_bytes, next.peak_bytes);
      current = std::move(next);
      return true;
    }
    return false;
  };

  // Pruning, most expensive choice first.
  std::vector<std::pair<double, int>> chosen;
  for (size_t a = 0; a < d.size(); ++a) {
    if (d[a].action == Action::kRetain) continue;
    const double cost = d[a].action == Action::kRecompute
                            ? current.segment_ms_of[a]
                            : current.stall_ms_of[a];
    chosen.emplace_back(-cost, static_cast<int>(a));
  }
  std::sort(chosen.begin(), chosen.end());
  for (const auto& [neg_cost, a] : chosen) {
    if (!budget_left()) break;
    const Decision kept = d[a];
    d[a] = Decision{};
    if (!try_change(false)) d[a] = kept;
  }

  // Exchange: a recomputation for a retained activation that is cheaper
  // to rebuild, first improvement, until none helps.
  const std::vector<PlanActivation>& acts = profile_.activations;
  std::vector<int> retained_by_cost;
  bool improved = true;
  while (improved && !c.bounded) {
    improved = false;
    retained_by_cost.clear();
    for (size_t a = 0; a < d.size(); ++a) {
      if (d[a].action == Action::kRetain && acts[a].size_bytes > 0 &&
          acts[a].recomputable) {
        retained_by_cost.push_back(static_cast<int>(a));
      }
    }
    std::sort(retained_by_cost.begin(), retained_by_cost.end(),
              [&](int x, int y) {
                return acts[x].recompute_ms < acts[y].recompute_ms;
              });
    for (size_t a = 0; a < d.size() && !improved && !c.bounded; ++a) {
      if (d[a].action != Action::kRecompute) continue;
      for (int r : retained_by_cost) {
        if (!budget_left()) break;
        d[a] = Decision{};
        d[r].action = Action::kRecompute;
        if (try_change(true)) {
          improved = true;
          break;
        }
        d[r] = Decision{};
        d[a].action = Action::kRecompute;
      }
    }
  }
  c.iteration_ms = current.iteration_ms;
  c.peak_bytes = current.peak_bytes;
}

Planner::Candidate Planner::MakeCandidate(int64_t budget_bytes) {
  Candidate best;
  best.critical_bytes = kNoFit;
  const int n = static_cast<int>(profile_.activations.size());
  if (sim_->baseline_peak_bytes() <= budget_bytes) {
    best.decisions = Decisions(n);
    best.iteration_ms = sim_->baseline_iteration_ms();
    best.peak_bytes = sim_->baseline_peak_bytes();
    best.critical_bytes = best.peak_bytes;
    return best;
  }
  bool found = false;
  int64_t critical = kNoFit;
  int64_t simulations = 0;
  bool bounded = false;
  for (int order = 0; order < orders(); ++order) {
    const int fit = FirstFit(order, budget_bytes);
    if (fit < -1) continue;
    Track& track = tracks_[order];
    // An improved candidate is the same for every budget in [its critical
    // budget, the budget it was made for] (and so is the first fitting
    // state): reuse it.
    Candidate c;
    auto cached = std::find_if(
        track.improved.begin(), track.improved.end(), [&](const Improved& e) {
          return e.candidate.critical_bytes <= budget_bytes &&
                 budget_bytes <= e.budget_bytes;
        });
    if (cached != track.improved.end()) {
      c = cached->candidate;
      c.simulations = 0;
    } else {
      c.decisions = StateDecisions(track, fit);
      c.critical_bytes = StatePeak(track, fit);
      Improve(budget_bytes, c);
      track.improved.push_back(Improved{budget_bytes, c});
    }
    critical = std::max(critical, c.critical_bytes);
    simulations += c.simulations;
    bounded |= c.bounded;
    if (!found || c.iteration_ms < best.iteration_ms) {
      best = std::move(c);
      found = true;
    }
  }
  best.critical_bytes = critical;
  best.simulations = simulations;
  best.bounded = bounded;
  return best;
}

PlanResult Planner::Plan(int64_t budget_bytes) {
  PlanResult result;
  result.policy = options_.policy;
  result.budget_bytes = budget_bytes;
  result.baseline_peak_bytes = sim_->baseline_peak_bytes();
  result.baseline_iteration_ms = sim_->baseline_iteration_ms();
  const int n = static_cast<int>(profile_.activations.size());
  // Large graphs: the first state of each trajectory that fits (Algorithm
  // B's stop), timed in full; the fastest wins (ties: the lower peak, then
  // the earlier trajectory).
  int large_order = -1, large_index = -2;
  if (!small_ && options_.policy == Policy::kMutwo) {
    double best_ms = 0;
    int64_t best_peak = 0;
    for (int order = 0; order < orders(); ++order) {
      const int fit = options_.close_over_replays
                          ? ClosedFirstFit(order, budget_bytes)
                          : FirstFit(order, budget_bytes);
      if (fit < -1) continue;
      ++result.probes;
      const int64_t peak = StatePeak(tracks_[order], fit);
      auto [it, added] = timed_ms_.try_emplace({order, fit}, 0.0);
      if (added) {
        it->second =
            sim_->Run(StateDecisions(tracks_[order], fit)).iteration_ms;
        ++result.simulations;
      }
      if (large_order < 0 || it->second < best_ms ||
          (it->second == best_ms && peak < best_peak)) {
        large_order = order;
        large_index = fit;
        best_ms = it->second;
        best_peak = peak;
      }
    }
    result.floor_bytes =
        options_.compute_floor || large_order < 0 ? FloorBytes() : 0;
  } else {
    result.floor_bytes = FloorBytes();
  }
  if (options_.policy != Policy::kMutwo) {
    result.decisions = fixed_decisions_;
  } else if (budget_bytes < result.floor_bytes) {
    // Best effort: the trajectory state with the lowest peak.
    int best_order = -1, best_index = -1;
    for (int order = 0; order < orders(); ++order) {
      const Track& track = tracks_[order];
      const int steps = static_cast<int>(Trajectory(order).size());
      for (int i = -1; i < steps; ++i) {
        if (best_order < 0 ||
            StatePeak(track, i) < StatePeak(tracks_[best_order], best_index)) {
          best_order = order;
          best_index = i;
        }
      }
    }
    result.decisions = best_order < 0
                           ? Decisions(n)
                           : StateDecisions(tracks_[best_order], best_index);
  } else if (!small_) {
    result.decisions = large_order < 0
                           ? Decisions(n)
                           : StateDecisions(tracks_[large_order], large_index);
  } else {
    // The cheapest candidate over this budget and every tighter budget at
    // which the candidate changes.
    Candidate best;
    bool found = false;
    int64_t b = budget_bytes;
    while (b >= result.floor_bytes && !Interrupted()) {
      if (result.probes >= options_.max_probes) {
        result.bounded = true;
        break;
      }
      Candidate c = MakeCandidate(b);
      ++result.probes;
      result.simulations += c.simulations;
      result.bounded |= c.bounded;
      if (c.critical_bytes == kNoFit) break;
      const int64_t next = c.critical_bytes - 1;
      if (!found || c.iteration_ms < best.iteration_ms) {
        best = std::move(c);
        found = true;
      }
      b = next;
    }
    result.decisions = found ? std::move(best.decisions) : Decisions(n);
  }
  Simulator::Options sim_options;
  sim_options.record_curve = options_.record_curve;
  result.sim = sim_->Run(result.decisions, sim_options);
  // What the executor will recompute anyway (replay_closure.h); kept when
  // the simulation agrees it is no higher.
  Decisions closed =
      options_.close_over_replays
          ? CloseOverReplays(profile_, result.decisions, result.sim)
          : result.decisions;
  if (closed != result.decisions) {
    SimResult closed_sim = sim_->Run(closed, sim_options);
    if (closed_sim.peak_bytes <= result.sim.peak_bytes) {
      result.decisions = std::move(closed);
      result.sim = std::move(closed_sim);
    }
  }
  result.feasible = result.sim.peak_bytes <= budget_bytes;
  result.interrupted = Interrupted();
  if (!result.feasible) {
    result.reason = absl::StrCat(
        "budget of ", budget_bytes, " bytes is below the lowest peak the ",
        PolicyName(options_.policy), " policy reaches (", result.floor_bytes,
        " bytes; baseline peak ", result.baseline_peak_bytes, " bytes)");
  }
  return result;
}

std::vector<ParetoPoint> Planner::Pareto(int points) {
  const bool curve = options_.record_curve;
  options_.record_curve = false;
  std::vector<ParetoPoint> out;
  const int64_t floor = FloorBytes();
  std::vector<int64_t> budgets =
      BudgetSweep(floor, sim_->baseline_peak_bytes(), points);
  // The fixed schedules the trajectories start from are points of their
  // own: at their peaks the curve is at least as fast as they are.
  for (const Track& track : tracks_) {
    if (track.seed_peak_bytes > floor &&
        track.seed_peak_bytes < sim_->baseline_peak_bytes()) {
      budgets.push_back(track.seed_peak_bytes);
    }
  }
  std::sort(budgets.begin(), budgets.end());
  budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
  for (int64_t budget : budgets) {
    if (Interrupted()) break;
    PlanResult r = Plan(budget);
    if (!r.feasible) continue;
    out.push_back(ParetoPoint{budget, r.sim.peak_bytes, r.sim.iteration_ms,
                              r.sim.recomputed, r.sim.swapped});
  }
  options_.record_curve = curve;
  return NonDominated(std::move(out));
}

}  // namespace mutwo::planner
