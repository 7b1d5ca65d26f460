#include "planner/plan_request.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "planner/max_batch.h"
#include "planner/pareto.h"
#include "planner/planner.h"
#include "planner/proto_convert.h"

namespace mutwo::planner {

int64_t AllocatorReserveBytes(const v1::Profile& profile,
                              int64_t budget_bytes) {
  const bool cuda = profile.device().kind() == "cuda";
  const int64_t fixed = cuda ? kReserveFixedBytes : kCpuReserveFixedBytes;
  const double fraction = cuda ? kReserveFraction : kCpuReserveFraction;
  return fixed + static_cast<int64_t>(
                     fraction *
                     static_cast<double>(std::max<int64_t>(0, budget_bytes)));
}

absl::StatusOr<int64_t> ResolveBudget(const v1::MemoryBudget& budget,
                                      int64_t baseline_peak_bytes,
                                      int64_t device_total_bytes) {
  if (budget.kind_case() != v1::MemoryBudget::KIND_NOT_SET) {
    MUTWO_RETURN_IF_ERROR(ValidateBudget(budget));
  }
  switch (budget.kind_case()) {
    case v1::MemoryBudget::kBytes:
      return budget.bytes();
    case v1::MemoryBudget::kFractionOfBaseline:
      return static_cast<int64_t>(
          std::floor(budget.fraction_of_baseline() *
                     static_cast<double>(baseline_peak_bytes)));
    case v1::MemoryBudget::kFractionOfDevice:
      if (device_total_bytes <= 0) {
        return absl::InvalidArgumentError(
            "budget is a fraction of the device, but the profile's "
            "device.total_bytes is not set");
      }
      return static_cast<int64_t>(
          std::floor(budget.fraction_of_device() *
                     static_cast<double>(device_total_bytes)));
    case v1::MemoryBudget::kKnee:
      return absl::InvalidArgumentError(
          "budget \"auto\" (the knee of the Pareto curve) is resolved by "
          "planning, not from the baseline peak alone");
    case v1::MemoryBudget::kFloor:
      return absl::InvalidArgumentError(
          "budget \"floor\" is resolved by planning, not from the baseline "
          "peak alone");
    case v1::MemoryBudget::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "budget is not set: give bytes, a fraction of the baseline peak, a "
      "fraction of the device or auto");
}

namespace {

// The smallest budget whose reserve leaves `peak_bytes` of room.
int64_t LowestBudgetAbove(const v1::Profile& profile, int64_t peak_bytes) {
  // The device's own reserve fraction: with another one the estimate is
  // off by a fraction of the peak, and the loops below walk it byte by byte.
  const double fraction = profile.device().kind() == "cuda"
                              ? kReserveFraction
                              : kCpuReserveFraction;
  int64_t budget = static_cast<int64_t>(std::ceil(
      (static_cast<double>(peak_bytes) + AllocatorReserveBytes(profile, 0)) /
      (1 - fraction)));
  while (budget - AllocatorReserveBytes(profile, budget) < peak_bytes) {
    ++budget;
  }
  // The estimate may land a byte or two high (the reserve is truncated).
  while (budget > 0 &&
         budget - 1 - AllocatorReserveBytes(profile, budget - 1) >=
             peak_bytes) {
    --budget;
  }
  return budget;
}

// What the reserve is, after its size.
std::string ReserveWhy(const v1::Profile& profile) {
  return profile.device().kind() == "cuda"
             ? " (4 MiB + 1% of the budget) for the CUDA caching allocator's "
               "block rounding"
             : " (16 KiB + 1.5% of the budget) for what the memory model "
               "leaves out of replays";
}

// A recurrent layer is one op of the graph (aten::lstm keeps every time
// step's gates and states for its backward): mutwo recomputes or swaps
// what it keeps whole and cannot split it by time step. Names each such
// layer with the bytes it keeps; empty when the model has none.
std::string RecurrentLayersNote(const v1::Profile& profile) {
  static constexpr std::string_view kRecurrentOps[] = {
      "aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"};
  std::map<int, int64_t> kept;  // producer node -> activation bytes
  for (const v1::Activation& a : profile.activations()) {
    kept[a.producer_node()] += a.size_bytes();
  }
  std::vector<std::string> layers;
  for (const v1::ProfileNode& n : profile.nodes()) {
    if (std::find(std::begin(kRecurrentOps), std::end(kRecurrentOps),
                  n.kind()) == std::end(kRecurrentOps)) {
      continue;
    }
    layers.push_back(absl::StrCat(
        n.kind(), " (",
        n.scope().empty() ? absl::StrCat("node ", n.id()) : n.scope(), ", ",
        FormatBytes(kept[n.id()]), " kept for backward)"));
  }
  if (layers.empty()) return "";
  return absl::StrCat(
      absl::StrJoin(layers, ", "),
      ": a recurrent layer is one op to mutwo, which recomputes or swaps what "
      "it keeps whole and cannot split it by time step; a scripted loop over "
      "nn.LSTMCell or nn.GRUCell lets it plan within the layer");
}

// Plans `plan_profile` (the model of `profile`, or of `profile`'s graph at
// another batch size) and writes the v1::Schedule.
absl::StatusOr<v1::Schedule> PlanModel(const v1::Profile& profile,
                                       const PlanProfile& plan_profile,
                                       const ScheduleRequest& request) {
  if (request.pareto_points == 1 || request.pareto_points < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pareto_points = ", request.pareto_points, ": use 0 or >= 2"));
  }
  Planner::Options options;
  options.policy = PolicyFromProto(request.policy);
  options.allow_swap = request.allow_swap;
  options.record_curve = request.max_timeline_samples > 0;
  options.interrupt = request.interrupt;
  MUTWO_ASSIGN_OR_RETURN(auto planner, Planner::Create(plan_profile, options));
  const bool with_reserve =
      options.policy == Policy::kMutwo && request.device_reserve;
  const int64_t baseline_peak = planner->simulator().baseline_peak_bytes();
  int64_t budget_bytes = 0;
  std::vector<ParetoPoint> curve;
  std::string resolved_note;
  if (request.budget.kind_case() == v1::MemoryBudget::kKnee) {
    // `auto`: the lowest budget at which the knee's plan fits with the
    // reserve. The knee comes from the uncorrected curve, so every round
    // of the closed loop resolves the same budget.
    curve = planner->Pareto(request.pareto_points >= 2 ? request.pareto_points
                                                       : kKneeParetoPoints);
    if (request.interrupt != nullptr && request.interrupt->Stopped()) {
      return request.interrupt->status();
    }
    const int knee = KneeIndex(curve);
    if (knee < 0) {
      return absl::FailedPreconditionError(
          "budget auto: the Pareto curve has no point (no schedule fits "
          "even at the baseline peak)");
    }
    const int64_t knee_budget = KneeBudget(curve);
    // Never above the baseline peak, as the floor and the curve's rows: the
    // unmodified step fits it, and a model of a few MiB under the CUDA
    // reserve's 4 MiB would otherwise get a budget on no row.
    budget_bytes =
        with_reserve
            ? std::min(baseline_peak, LowestBudgetAbove(profile, knee_budget))
            : knee_budget;
    // The knee is one point of the curve, named by its place: the Pareto
    // table lists it with `auto`'s budget and this schedule's peak and time,
    // so no other figure is called the knee.
    int point = knee;
    for (size_t i = 0; i < curve.size(); ++i) {
      if (curve[i].budget_bytes == knee_budget) point = static_cast<int>(i);
    }
    const int weighted = point;
    if (budget_bytes >= baseline_peak && knee_budget < baseline_peak) {
      point = static_cast<int>(curve.size()) - 1;  // the unmodified step
    }
    // How far it moves is said where `auto` is read: the same model
    // profiled again gives other step times (PlanRequestTest.
    // AutoBudgetIsStableUnderTimingNoise measures the 5.7%).
    constexpr char kStability[] =
        "a new profile of the same model, its step times a few % apart, "
        "moved it by at most 5.7% on the planner's noise test";
    resolved_note = absl::StrCat(
        "auto: the knee of the Pareto curve, its point ", point + 1, " of ",
        curve.size(),
        point != weighted
            ? absl::StrCat(", the unmodified step: point ", weighted + 1,
                           " with the reserve on top would lie above the "
                           "baseline peak (",
                           kStability, ")")
        : point == knee
            ? absl::StrCat(", the one that trades memory for time best (",
                           kStability, ")")
            : absl::StrCat(
                  " (the budget in the middle of the points that trade "
                  "memory for time nearly as well as the best one, point ",
                  knee + 1,
                  ", so that timing noise moves it little: ", kStability, ")"));
  } else if (request.budget.kind_case() == v1::MemoryBudget::kFloor) {
    // `floor`: the lowest budget the plan fits with the reserve, never
    // above the baseline peak (the unmodified step fits that). The same
    // budget every round: the closed loop measures it, never plans lower.
    const int64_t lowest = planner->FloorBytes();
    budget_bytes =
        std::min(baseline_peak,
                 with_reserve ? LowestBudgetAbove(profile, lowest) : lowest);
    resolved_note =
        absl::StrCat("floor: the lowest predicted peak ", FormatBytes(lowest),
                     with_reserve ? " with the reserve on top" : "");
  } else {
    MUTWO_ASSIGN_OR_RETURN(budget_bytes,
                           ResolveBudget(request.budget, baseline_peak,
                                         plan_profile.device_total_bytes));
  }
  if (request.correction_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "correction_bytes = ", request.correction_bytes, ": must be >= 0"));
  }
  // μ-TWO plans below the budget by the device reserve; the
  // fixed baseline schedules are only checked against the budget. Both are
  // planned below it by the correction measurements taught.
  // The unmodified step fits any budget at or above its measured peak: the
  // reserve covers what replays leave out of the memory model (and the CUDA
  // allocator's rounding of what a schedule changes), and with no decision
  // there is no replay and nothing the profile did not measure. So such a
  // budget is planned to itself: zero decisions, FITS.
  const bool unmodified_fits = budget_bytes >= baseline_peak;
  const int64_t reserve = with_reserve && !unmodified_fits
                              ? AllocatorReserveBytes(profile, budget_bytes)
                              : 0;
  const int64_t correction = request.correction_bytes;
  PlanResult result =
      planner->Plan(std::max<int64_t>(0, budget_bytes - reserve - correction));
  if (request.interrupt != nullptr && request.interrupt->Stopped()) {
    return request.interrupt->status();
  }
  if (reserve > 0 || correction > 0) result.budget_bytes = budget_bytes;
  if (with_reserve) {
    // The lowest budget that is feasible: the plan's floor with the reserve
    // on top, but never above the baseline peak (the unmodified step).
    result.floor_bytes =
        std::min(baseline_peak, LowestBudgetAbove(profile, result.floor_bytes));
  }
  if (!result.feasible && budget_bytes < result.floor_bytes) {
    // Refused: the budget and the floor, in the units of every other figure;
    // what it was planned for less the reserve would be a third budget.
    const int64_t floor_reserve =
        with_reserve ? AllocatorReserveBytes(profile, result.floor_bytes) : 0;
    std::string what;
    if (result.floor_bytes >= baseline_peak) {
      what = "the baseline peak (the unmodified step)";
    } else if (floor_reserve > 0) {
      what =
          absl::StrCat("the lowest peak the ", PolicyName(options.policy),
                       " policy reaches, ", FormatBytes(result.sim.peak_bytes),
                       ", plus a reserve of ", FormatBytes(floor_reserve),
                       ReserveWhy(profile));
    } else {
      what = absl::StrCat("the lowest peak the ", PolicyName(options.policy),
                          " policy reaches");
    }
    result.reason = absl::StrCat(
        "the budget ", FormatBytes(budget_bytes), " is below the floor ",
        FormatBytes(result.floor_bytes), ", ", what, "; baseline peak ",
        FormatBytes(baseline_peak));
  } else {
    if (!result.feasible) {
      // Over the floor, but planned below it by a correction.
      result.reason = absl::StrCat(
          "the budget less what follows is below the lowest peak the ",
          PolicyName(options.policy), " policy reaches, ",
          FormatBytes(result.sim.peak_bytes));
    }
    if (reserve > 0) {
      result.reason = absl::StrCat(
          result.reason, result.reason.empty() ? "" : "; ", "planned for ",
          FormatBytes(budget_bytes - reserve - correction),
          ", the budget less a reserve of ", FormatBytes(reserve),
          ReserveWhy(profile));
    }
  }
  if (correction > 0) {
    result.reason = absl::StrCat(
        result.reason, result.reason.empty() ? "" : "; ", "planned ",
        FormatBytes(correction), " below the budget",
        reserve > 0 ? " (and the reserve)" : "",
        ": what validations measured above the prediction, plus a margin");
  }
  if (!resolved_note.empty()) {
    result.reason = absl::StrCat(
        resolved_note, result.reason.empty() ? "" : "; ", result.reason);
  }
  if (const std::string recurrent = RecurrentLayersNote(profile);
      !recurrent.empty()) {
    result.reason = absl::StrCat(result.reason,
                                 result.reason.empty() ? "" : "; ", recurrent);
  }
  v1::Schedule schedule =
      ScheduleToProto(profile, planner->profile(), result, request.budget,
                      request.max_timeline_samples);
  schedule.set_correction_bytes(correction);
  if (request.pareto_points >= 2) {
    if (curve.empty()) curve = planner->Pareto(request.pareto_points);
    for (const ParetoPoint& pt : curve) {
      v1::ParetoPoint* out = schedule.add_pareto();
      // The budget a user gives for this point, as `auto` and the floor are
      // given: the budget it was planned at with the reserve on top (never
      // above the baseline peak), so that `auto` is its point's budget and
      // that budget plans this very point. The planner's own budget lies
      // below it by the reserve, so the curve's first point would sit below
      // the floor the schedule reports.
      out->set_budget_bytes(
          with_reserve ? std::min(baseline_peak,
                                  LowestBudgetAbove(profile, pt.budget_bytes))
                       : pt.budget_bytes);
      out->set_predicted_peak_bytes(pt.predicted_peak_bytes);
      out->set_predicted_iteration_ms(pt.predicted_iteration_ms);
      out->set_recomputed(pt.recomputed);
      out->set_swapped(pt.swapped);
    }
  }
  if (request.interrupt != nullptr && request.interrupt->Stopped()) {
    return request.interrupt->status();
  }
  return schedule;
}

}  // namespace

absl::StatusOr<v1::Schedule> PlanSchedule(const v1::Profile& profile,
                                          const ScheduleRequest& request) {
  MUTWO_ASSIGN_OR_RETURN(PlanProfile plan_profile, ProfileFromProto(profile));
  return PlanModel(profile, plan_profile, request);
}

absl::StatusOr<v1::Schedule> PlanScheduleAtBatch(
    const std::vector<v1::Profile>& profiles, int64_t batch_size,
    const ScheduleRequest& request) {
  if (batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size ", batch_size, ": must be > 0"));
  }
  MUTWO_ASSIGN_OR_RETURN(std::vector<BatchProfile> batch_profiles,
                         BatchProfilesFromProto(profiles));
  MUTWO_ASSIGN_OR_RETURN(PlanProfile plan_profile,
                         ExtrapolateProfile(batch_profiles, batch_size));
  // The graph's ids come from the largest profile; sizes and times from the
  // fit.
  const v1::Profile* largest = &profiles.front();
  for (const v1::Profile& p : profiles) {
    if (p.batch_size() > largest->batch_size()) largest = &p;
  }
  v1::Profile at_batch = *largest;
  at_batch.set_batch_size(batch_size);
  MUTWO_ASSIGN_OR_RETURN(v1::Schedule schedule,
                         PlanModel(at_batch, plan_profile, request));
  std::string sizes;
  for (const v1::Profile& p : profiles) {
    absl::StrAppend(&sizes, sizes.empty() ? "" : ", ", p.batch_size());
  }
  schedule.set_reason(absl::StrCat(
      schedule.reason(), schedule.reason().empty() ? "" : "; ",
      "extrapolated to batch size ", batch_size, " from profiles at ", sizes));
  return schedule;
}

absl::StatusOr<v1::MaxBatchPrediction> PredictMaxBatchProto(
    const std::vector<v1::Profile>& profiles, int64_t capacity_bytes,
    double max_overhead) {
  MUTWO_ASSIGN_OR_RETURN(std::vector<BatchProfile> batch_profiles,
                         BatchProfilesFromProto(profiles));
  MaxBatchOptions options;
  options.capacity_bytes =
      capacity_bytes > 0
          ? capacity_bytes
          : static_cast<int64_t>(
                0.95 *
                static_cast<double>(profiles.front().device().total_bytes()));
  options.max_overhead = max_overhead > 0 ? max_overhead : 0.25;
  options.reserve_bytes =
      AllocatorReserveBytes(profiles.front(), options.capacity_bytes);
  MUTWO_ASSIGN_OR_RETURN(MaxBatchResult r,
                         PredictMaxBatch(batch_profiles, options));
  v1::MaxBatchPrediction out;
  out.set_capacity_bytes(r.capacity_bytes);
  out.set_max_batch_without_checkpointing(r.max_batch_without_checkpointing);
  out.set_max_batch_with_schedule(r.max_batch_with_schedule);
  out.set_max_overhead(r.max_overhead);
  for (int64_t b : r.profiled_batch_sizes) out.add_profiled_batch_sizes(b);
  for (int64_t b : r.verify_batch_sizes) out.add_verify_batch_sizes(b);
  out.set_bytes_per_sample(r.bytes_per_sample);
  out.set_bytes_intercept(r.bytes_intercept);
  out.set_fragmentation_fraction(r.fragmentation_fraction);
  out.set_reserve_bytes(r.reserve_bytes);
  out.set_extrapolation(r.extrapolation);
  out.set_reason(r.reason);
  return out;
}

}  // namespace mutwo::planner
