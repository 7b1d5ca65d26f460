#include "server/planner/planner.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/planner/baselines.h"

namespace mutwo::planner {
namespace {

constexpr int64_t kNoFit = std::numeric_limits<int64_t>::min();

}  // namespace

absl::StatusOr<std::unique_ptr<Planner>> Planner::Create(PlanProfile profile,
                                                         Options options) {
  auto planner =
      std::unique_ptr<Planner>(new Planner(std::move(profile), options));
  MUTWO_ASSIGN_OR_RETURN(planner->sim_, Simulator::Create(&planner->profile_));
  planner->small_ = static_cast<int>(planner->profile_.activations.size()) <=
                    options.small_graph_activations;
  // Large graphs run only the paper's trajectory.
  for (int order = 0; order < planner->orders(); ++order) {
    MutwoPolicy::Options policy_options;
    policy_options.allow_swap = options.allow_swap;
    policy_options.order = order == 0 ? MutwoPolicy::Options::Order::kRatio
                                      : MutwoPolicy::Options::Order::kCheapest;
    policy_options.refine = planner->small_;
    policy_options.time_each_step = planner->small_;
    policy_options.incremental = options.incremental;
    MUTWO_ASSIGN_OR_RETURN(
        planner->policies_[order],
        MutwoPolicy::Create(planner->sim_.get(), policy_options));
  }
  switch (options.policy) {
    case Policy::kMutwo:
      break;
    case Policy::kNone:
      planner->fixed_decisions_ = NoCheckpointing(planner->profile_);
      break;
    case Policy::kSqrtN:
      planner->fixed_decisions_ = SqrtNCheckpointing(planner->profile_);
      break;
    case Policy::kPerBlock:
      planner->fixed_decisions_ = PerBlockCheckpointing(planner->profile_);
      break;
  }
  return planner;
}

void Planner::Extend(int order, int64_t peak_bytes) {
  std::vector<TrajectoryStep>& steps = trajectories_[order];
  if (policies_[order] == nullptr) exhausted_[order] = true;  // large graph
  TrajectoryStep step;
  while (!exhausted_[order] &&
         (steps.empty() ? sim_->baseline_peak_bytes()
                        : steps.back().peak_bytes) > peak_bytes) {
    if (policies_[order]->Step(&step)) {
      steps.push_back(std::move(step));
    } else {
      exhausted_[order] = true;
    }
  }
}

const std::vector<TrajectoryStep>& Planner::Trajectory(int order) {
  Extend(order, std::numeric_limits<int64_t>::min());
  return trajectories_[order];
}

int64_t Planner::FloorBytes() {
  if (options_.policy != Policy::kMutwo) {
    if (!fixed_.has_value()) fixed_ = sim_->Run(fixed_decisions_);
    return fixed_->peak_bytes;
  }
  int64_t floor = sim_->baseline_peak_bytes();
  for (int order = 0; order < orders(); ++order) {
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
    if (c.simulations < options_.max_improve_simulations) return true;
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
      if (d[a].action == Action::kRetain && acts[a].size_bytes > 0) {
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
    const std::vector<TrajectoryStep>& steps = Trajectory(order);
    size_t fit = 0;
    while (fit < steps.size() && steps[fit].peak_bytes > budget_bytes) ++fit;
    if (fit == steps.size()) continue;
    Candidate c;
    c.decisions = DecisionsAfter(n, steps, fit + 1);
    c.critical_bytes = steps[fit].peak_bytes;
    Improve(budget_bytes, c);
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
  if (!small_ && options_.policy == Policy::kMutwo && !options_.compute_floor) {
    Extend(0, budget_bytes);
    const std::vector<TrajectoryStep>& steps = trajectories_[0];
    const bool fits =
        result.baseline_peak_bytes <= budget_bytes ||
        (!steps.empty() && steps.back().peak_bytes <= budget_bytes);
    result.floor_bytes = fits ? 0 : FloorBytes();
  } else {
    result.floor_bytes = FloorBytes();
  }
  if (options_.policy != Policy::kMutwo) {
    result.decisions = fixed_decisions_;
  } else if (budget_bytes < result.floor_bytes) {
    // Best effort: the trajectory state with the lowest peak.
    const std::vector<TrajectoryStep>* best_steps = nullptr;
    size_t best_index = 0;
    for (int order = 0; order < orders(); ++order) {
      const std::vector<TrajectoryStep>& steps = Trajectory(order);
      for (size_t i = 0; i < steps.size(); ++i) {
        if (best_steps == nullptr ||
            steps[i].peak_bytes < (*best_steps)[best_index].peak_bytes) {
          best_steps = &steps;
          best_index = i;
        }
      }
    }
    result.decisions = best_steps == nullptr
                           ? Decisions(n)
                           : DecisionsAfter(n, *best_steps, best_index + 1);
  } else if (!small_) {
    // The first trajectory state that fits (Algorithm B's stop).
    Extend(0, budget_bytes);
    const std::vector<TrajectoryStep>& steps = trajectories_[0];
    size_t best = steps.size();
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].peak_bytes <= budget_bytes) {
        best = i;
        break;
      }
    }
    result.probes = 1;
    result.decisions =
        result.baseline_peak_bytes <= budget_bytes || best == steps.size()
            ? Decisions(n)
            : DecisionsAfter(n, steps, best + 1);
  } else {
    // The cheapest candidate over this budget and every tighter budget at
    // which the candidate changes.
    Candidate best;
    bool found = false;
    int64_t b = budget_bytes;
    while (b >= result.floor_bytes) {
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
  result.feasible = result.sim.peak_bytes <= budget_bytes;
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
  for (int64_t budget :
       BudgetSweep(FloorBytes(), sim_->baseline_peak_bytes(), points)) {
    PlanResult r = Plan(budget);
    if (!r.feasible) continue;
    out.push_back(ParetoPoint{budget, r.sim.peak_bytes, r.sim.iteration_ms,
                              r.sim.recomputed, r.sim.swapped});
  }
  options_.record_curve = curve;
  return NonDominated(std::move(out));
}

}  // namespace mutwo::planner
