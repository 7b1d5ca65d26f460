#include "planner/max_batch.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "planner/planner.h"

namespace mutwo::planner {
namespace {

absl::Status CheckSameGraph(const std::vector<BatchProfile>& profiles) {
  std::set<int64_t> sizes;
  for (const BatchProfile& bp : profiles) {
    if (bp.batch_size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch size ", bp.batch_size, " must be positive"));
    }
    sizes.insert(bp.batch_size);
  }
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError(
        "max batch size needs profiles at two or more distinct batch sizes");
  }
  const PlanProfile& first = profiles.front().profile;
  for (const BatchProfile& bp : profiles) {
    const PlanProfile& p = bp.profile;
    bool same = p.nodes.size() == first.nodes.size() &&
                p.backward_steps.size() == first.backward_steps.size() &&
                p.activations.size() == first.activations.size();
    for (size_t a = 0; same && a < p.activations.size(); ++a) {
      const PlanActivation& x = p.activations[a];
      const PlanActivation& y = first.activations[a];
      same = x.producer_node == y.producer_node &&
             x.last_forward_use == y.last_forward_use &&
             x.first_backward_use == y.first_backward_use &&
             x.last_backward_use == y.last_backward_use;
    }
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profiles at batch sizes ", profiles.front().batch_size, " and ",
          bp.batch_size,
          " have different graphs (nodes, backward steps or activations "
          "differ); profile the same model and inputs"));
    }
  }
  return absl::OkStatus();
}

// Least-squares line through (batch, value(profile)), evaluated at `batch`.
class Fitter {
 public:
  Fitter(const std::vector<BatchProfile>& profiles, int64_t batch)
      : profiles_(profiles), x_(static_cast<double>(batch)) {
    for (const BatchProfile& bp : profiles) {
      mean_x_ += static_cast<double>(bp.batch_size);
    }
    mean_x_ /= profiles.size();
    for (const BatchProfile& bp : profiles) {
      const double dx = bp.batch_size - mean_x_;
      sxx_ += dx * dx;
    }
  }

  double At(const std::function<double(const PlanProfile&)>& value) const {
    double mean_y = 0, sxy = 0;
    for (const BatchProfile& bp : profiles_) mean_y += value(bp.profile);
    mean_y /= profiles_.size();
    for (const BatchProfile& bp : profiles_) {
      sxy += (bp.batch_size - mean_x_) * (value(bp.profile) - mean_y);
    }
    const double slope = sxx_ > 0 ? sxy / sxx_ : 0;
    return std::max(0.0, mean_y + slope * (x_ - mean_x_));
  }
  int64_t Bytes(const std::function<double(const PlanProfile&)>& value) const {
    return static_cast<int64_t>(std::llround(At(value)));
  }

 private:
  const std::vector<BatchProfile>& profiles_;
  double x_;
  double mean_x_ = 0;
  double sxx_ = 0;
};

// Largest b in [1, limit] with fits(b), assuming fits is monotone; 0 if none.
int64_t LargestFitting(int64_t limit,
                       const std::function<bool(int64_t)>& fits) {
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= limit && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > limit) {
    if (fits(limit)) return limit;
    hi = limit;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

absl::StatusOr<PlanProfile> ExtrapolateProfile(
    const std::vector<BatchProfile>& profiles, int64_t batch_size) {
  MUTWO_RETURN_IF_ERROR(CheckSameGraph(profiles));
  const Fitter f(profiles, batch_size);
  PlanProfile out = profiles.front().profile;
  for (size_t i = 0; i < out.nodes.size(); ++i) {
    PlanNode& n = out.nodes[i];
    n.forward_ms =
        f.At([i](const PlanProfile& p) { return p.nodes[i].forward_ms; });
    n.host_ms = f.At([i](const PlanProfile& p) { return p.nodes[i].host_ms; });
    n.allocated_bytes_after = f.Bytes([i](const PlanProfile& p) {
      return static_cast<double>(p.nodes[i].allocated_bytes_after);
    });
    n.peak_bytes_during = f.Bytes([i](const PlanProfile& p) {
      return static_cast<double>(p.nodes[i].peak_bytes_during);
    });
  }
  for (size_t i = 0; i < out.backward_steps.size(); ++i) {
    PlanBackwardStep& s = out.backward_steps[i];
    s.ms = f.At([i](const PlanProfile& p) { return p.backward_steps[i].ms; });
    s.allocated_bytes_after = f.Bytes([i](const PlanProfile& p) {
      return static_cast<double>(p.backward_steps[i].allocated_bytes_after);
    });
    s.peak_bytes_during = f.Bytes([i](const PlanProfile& p) {
      return static_cast<double>(p.backward_steps[i].peak_bytes_during);
    });
  }
  for (size_t i = 0; i < out.activations.size(); ++i) {
    PlanActivation& a = out.activations[i];
    a.size_bytes = f.Bytes([i](const PlanProfile& p) {
      return static_cast<double>(p.activations[i].size_bytes);
    });
    a.inactive_ms = f.At(
        [i](const PlanProfile& p) { return p.activations[i].inactive_ms; });
    a.recompute_ms = f.At(
        [i](const PlanProfile& p) { return p.activations[i].recompute_ms; });
    a.swap_ms =
        f.At([i](const PlanProfile& p) { return p.activations[i].swap_ms; });
  }
  out.fixed_bytes = f.Bytes(
      [](const PlanProfile& p) { return static_cast<double>(p.fixed_bytes); });
  out.measured_peak_bytes = f.Bytes([](const PlanProfile& p) {
    return static_cast<double>(p.measured_peak_bytes);
  });
  out.measured_iteration_ms =
      f.At([](const PlanProfile& p) { return p.measured_iteration_ms; });
  // A per-replay host cost: it does not grow with the batch.
  double overhead = 0;
  for (const BatchProfile& b : profiles) {
    overhead = std::max(overhead, b.profile.replay_overhead_ms);
  }
  out.replay_overhead_ms = overhead;
  return out;
}

absl::StatusOr<MaxBatchResult> PredictMaxBatch(
    const std::vector<BatchProfile>& profiles, const MaxBatchOptions& options) {
  if (options.capacity_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity ", options.capacity_bytes, " bytes must be positive"));
  }
  if (options.reserve_bytes < 0 ||
      options.reserve_bytes >= options.capacity_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allocator reserve ", options.reserve_bytes,
        " bytes must be >= 0 and below the capacity ", options.capacity_bytes));
  }
  if (!(options.max_overhead >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max overhead ", options.max_overhead, " must be >= 0"));
  }
  MUTWO_RETURN_IF_ERROR(CheckSameGraph(profiles));
  MaxBatchResult result;
  result.capacity_bytes = options.capacity_bytes;
  result.max_overhead = options.max_overhead;

  // Fitted line of the simulated baseline peak, for the report; what the
  // allocator measured above the simulation, for the margin.
  std::vector<double> xs, ys;
  double fragmentation = 0;
  for (const BatchProfile& bp : profiles) {
    result.profiled_batch_sizes.push_back(bp.batch_size);
    MUTWO_ASSIGN_OR_RETURN(auto sim, Simulator::Create(&bp.profile));
    xs.push_back(static_cast<double>(bp.batch_size));
    const double simulated = static_cast<double>(sim->baseline_peak_bytes());
    ys.push_back(simulated);
    if (simulated > 0 && bp.profile.measured_peak_bytes > simulated) {
      fragmentation = std::max(
          fragmentation,
          static_cast<double>(bp.profile.measured_peak_bytes) / simulated - 1);
    }
  }
  result.fragmentation_fraction = fragmentation;
  result.reserve_bytes = options.reserve_bytes;
  const int64_t usable = options.capacity_bytes - options.reserve_bytes;
  // The largest peak a batch may be predicted at.
  const int64_t limit = static_cast<int64_t>(
      std::floor(static_cast<double>(usable) / (1 + fragmentation)));
  std::sort(result.profiled_batch_sizes.begin(),
            result.profiled_batch_sizes.end());
  double mx = 0, my = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    mx += xs[i];
    my += ys[i];
  }
  mx /= xs.size();
  my /= ys.size();
  for (size_t i = 0; i < xs.size(); ++i) {
    sxx += (xs[i] - mx) * (xs[i] - mx);
    sxy += (xs[i] - mx) * (ys[i] - my);
  }
  result.bytes_per_sample = sxx > 0 ? sxy / sxx : 0;
  result.bytes_intercept =
      static_cast<int64_t>(std::llround(my - result.bytes_per_sample * mx));

  absl::Status error;
  auto fits_without = [&](int64_t b) {
    auto p = ExtrapolateProfile(profiles, b);
    if (!p.ok()) return false;
    auto sim = Simulator::Create(&*p);
    return sim.ok() && (*sim)->baseline_peak_bytes() <= limit &&
           p->measured_peak_bytes <= usable;
  };
  auto fits_with = [&](int64_t b) {
    auto p = ExtrapolateProfile(profiles, b);
    if (!p.ok()) return false;
    Planner::Options po;
    po.allow_swap = options.allow_swap;
    auto planner = Planner::Create(*std::move(p), po);
    if (!planner.ok()) return false;
    PlanResult r = (*planner)->Plan(limit);
    return r.feasible && r.sim.iteration_ms <= r.baseline_iteration_ms *
                                                   (1 + options.max_overhead);
  };
  result.max_batch_without_checkpointing =
      LargestFitting(options.max_batch_size, fits_without);
  result.max_batch_with_schedule =
      std::max(result.max_batch_without_checkpointing,
               LargestFitting(options.max_batch_size, fits_with));
  for (int64_t b : {result.max_batch_without_checkpointing,
                    result.max_batch_with_schedule}) {
    if (b > 0 && std::find(result.verify_batch_sizes.begin(),
                           result.verify_batch_sizes.end(),
                           b) == result.verify_batch_sizes.end()) {
      result.verify_batch_sizes.push_back(b);
    }
  }
  const int64_t largest = result.profiled_batch_sizes.back();
  result.extrapolation = static_cast<double>(result.max_batch_with_schedule) /
                         static_cast<double>(largest);
  const std::string margin = absl::StrFormat(
      "peaks grown by %.1f%% (what the allocator measured over the "
      "simulation) against the capacity less a reserve of %.2f MiB",
      fragmentation * 100,
      static_cast<double>(options.reserve_bytes) / (1 << 20));
  if (result.max_batch_with_schedule == 0) {
    result.reason =
        absl::StrCat("even batch size 1 does not fit ", options.capacity_bytes,
                     " bytes with a schedule within +",
                     options.max_overhead * 100, "% iteration time; ", margin);
  } else {
    result.reason = absl::StrCat(
        "fitted from batch sizes ",
        absl::StrJoin(result.profiled_batch_sizes, ", "), "; ",
        result.extrapolation > 1
            ? absl::StrFormat("extrapolated %.1fx beyond batch size %d",
                              result.extrapolation, largest)
            : absl::StrCat("within the profiled batch sizes"),
        "; ", margin);
  }
  return result;
}

}  // namespace mutwo::planner
