// planner/plan_request.h: budget resolution, the allocator reserve,
// PlanSchedule (the knee, corrections, infeasible budgets) and
// PredictMaxBatchProto on the hand-built Diamond profile; PlanScheduleAtBatch
// on chain profiles that grow linearly with the batch size (end to end in
// plan_command_test.cc, PlanAtBatchCommandTest).
#include "planner/plan_request.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parse.h"
#include "planner/pareto.h"
#include "tests/planner/proto_profile.h"
#include "tests/testing/synthetic_profile.h"

namespace mutwo::planner {
namespace {

using testing::DiamondProto;
using testing::ProfileProto;
using testing::RandomProfile;

// `auto` resolves to the knee of the Pareto curve: a budget between the
// floor and the baseline peak at which the plan is the knee's point.
TEST(PlanRequestTest, AutoBudgetPlansAtTheKnee) {
  ScheduleRequest request;
  request.device_reserve = false;
  request.budget = *ParseBudget("AUTO");
  request.pareto_points = 20;
  auto s = PlanSchedule(DiamondProto(), request);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->feasible());
  EXPECT_EQ(s->budget().text(), "auto");
  ASSERT_GE(s->pareto_size(), 2);
  std::vector<ParetoPoint> curve;
  for (const v1::ParetoPoint& p : s->pareto()) {
    curve.push_back({p.budget_bytes(), p.predicted_peak_bytes(),
                     p.predicted_iteration_ms(), p.recomputed(), p.swapped()});
  }
  const int knee = KneeIndex(curve);
  ASSERT_GE(knee, 0);
  EXPECT_EQ(s->budget_bytes(), KneeBudget(curve));
  EXPECT_LE(s->predicted_peak_bytes(), s->budget_bytes());
  EXPECT_GE(s->budget_bytes(), s->floor_bytes());
  EXPECT_LE(s->budget_bytes(), s->baseline_peak_bytes());
  EXPECT_NE(s->reason().find("knee"), std::string::npos) << s->reason();
  // With the reserve: the lowest budget whose reserve leaves the knee's
  // peak, planned again the same way every time (the closed loop's rounds).
  request.device_reserve = true;
  v1::Profile big = DiamondProto();
  for (auto& a : *big.mutable_activations())
    a.set_size_bytes(a.size_bytes() << 12);
  auto a = PlanSchedule(big, request);
  auto b = PlanSchedule(big, request);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->budget_bytes(), b->budget_bytes());
  EXPECT_LE(a->predicted_peak_bytes(),
            a->budget_bytes() - AllocatorReserveBytes(big, a->budget_bytes()));
}

// What `mutwo plan --budget auto --pareto` prints names one figure per
// thing: `auto` is the budget of its point's row on the Pareto curve (the
// row's peak and time are the schedule's), the note names that point by its
// place and no size of its own, and the reserve note says the figure
// planned for is the budget less the reserve. A ViT printed `auto = 60.11
// MiB` beside a row `59.75 MiB -> 58.84 MiB` and a note calling 59.19 MiB
// and 66.97 MiB the knee.
TEST(PlanRequestTest, AutoIsTheBudgetOfItsRowOnTheParetoCurve) {
  // Hundreds of MiB, and a 1 MiB model on CUDA, where the reserve's 4 MiB
  // puts `auto` at the baseline peak (the unmodified step, the last row).
  for (const auto& [kind, shift] : std::vector<std::pair<const char*, int>>{
           {"cpu", 8}, {"cuda", 8}, {"cuda", 0}}) {
    for (int model = 0; model < 2; ++model) {
      std::mt19937 rng(model);
      v1::Profile profile =
          ProfileProto(RandomProfile(rng, 40), int64_t{1} << 30);
      profile.mutable_device()->set_kind(kind);
      for (auto& a : *profile.mutable_activations())
        a.set_size_bytes(a.size_bytes() << shift);
      ScheduleRequest request;
      request.budget = *ParseBudget("auto");
      request.pareto_points = 20;
      auto s = PlanSchedule(profile, request);
      ASSERT_TRUE(s.ok()) << s.status();
      int row = -1;
      for (int i = 0; i < s->pareto_size(); ++i) {
        if (s->pareto(i).budget_bytes() == s->budget_bytes()) row = i;
      }
      ASSERT_GE(row, 0) << kind << " model " << model
                        << ": auto = " << FormatBytes(s->budget_bytes())
                        << " is on no row; " << s->reason();
      EXPECT_EQ(s->pareto(row).predicted_peak_bytes(),
                s->predicted_peak_bytes())
          << kind << " model " << model;
      EXPECT_NEAR(s->pareto(row).predicted_iteration_ms(),
                  s->predicted_iteration_ms(), 1e-9)
          << kind << " model " << model;
      const std::string reason = s->reason();
      const std::string knee_note = reason.substr(0, reason.find(';'));
      EXPECT_NE(knee_note.find(absl::StrCat("its point ", row + 1, " of ",
                                            s->pareto_size())),
                std::string::npos)
          << reason;
      EXPECT_EQ(knee_note.find("iB"), std::string::npos) << reason;
      EXPECT_LE(s->budget_bytes(), s->baseline_peak_bytes()) << reason;
      if (s->budget_bytes() == s->baseline_peak_bytes()) {
        // The unmodified step: no reserve, no decision.
        EXPECT_EQ(s->recomputed() + s->swapped(), 0) << reason;
        EXPECT_EQ(reason.find("planned for"), std::string::npos) << reason;
        continue;
      }
      const int64_t reserve = AllocatorReserveBytes(profile, s->budget_bytes());
      EXPECT_NE(reason.find(absl::StrCat(
                    "planned for ", FormatBytes(s->budget_bytes() - reserve),
                    ", the budget less a reserve of ", FormatBytes(reserve))),
                std::string::npos)
          << reason;
    }
  }
}

// The profile of `p` again with every op, backward step, recompute and
// inactive time scaled by its own factor in [1 - noise, 1 + noise]: the same
// model profiled twice.
PlanProfile WithTimingNoise(PlanProfile p, double noise, std::mt19937& rng) {
  std::uniform_real_distribution<double> factor(1 - noise, 1 + noise);
  for (PlanNode& n : p.nodes) n.forward_ms *= factor(rng);
  for (PlanBackwardStep& s : p.backward_steps) s.ms *= factor(rng);
  for (PlanActivation& a : p.activations) {
    a.recompute_ms *= factor(rng);
    a.inactive_ms *= factor(rng);
  }
  p.measured_iteration_ms *= factor(rng);
  return p;
}

// `auto` recommends a budget for the model, not for one run's timings: op
// times off by up to 3% each (two profiles of the same model differ so)
// leave it where it was in all but a few of 36 noisy profiles, and move it
// by under 1% on average and by under 6% at most. The arg-min of the knee
// score moved in 8 of them, by 1.9% on average and by up to 19% (as the
// ViT of issue 30 moved by 10%). Random models of 40 ops, 6 noise draws
// each; the same with and without the device reserve.
TEST(PlanRequestTest, AutoBudgetIsStableUnderTimingNoise) {
  for (const bool reserve : {false, true}) {
    ScheduleRequest request;
    request.device_reserve = reserve;
    request.budget = *ParseBudget("auto");
    double worst = 0, sum = 0;
    int runs = 0, moves = 0;
    for (int model = 0; model < 6; ++model) {
      std::mt19937 rng(model);
      const PlanProfile base = RandomProfile(rng, 40);
      auto reference =
          PlanSchedule(ProfileProto(base, int64_t{1} << 30), request);
      ASSERT_TRUE(reference.ok()) << reference.status();
      for (int seed = 0; seed < 6; ++seed) {
        std::mt19937 noise(1000 + seed);
        auto s = PlanSchedule(
            ProfileProto(WithTimingNoise(base, 0.03, noise), int64_t{1} << 30),
            request);
        ASSERT_TRUE(s.ok()) << s.status();
        const double moved =
            std::abs(static_cast<double>(s->budget_bytes()) /
                         static_cast<double>(reference->budget_bytes()) -
                     1);
        EXPECT_LT(moved, 0.06)
            << "model " << model << ", noise seed " << seed << ", reserve "
            << reserve << ": " << s->reason() << "\nvs " << reference->reason();
        worst = std::max(worst, moved);
        sum += moved;
        moves += moved > 0;
        ++runs;
      }
    }
    EXPECT_LT(sum / runs, 0.01) << "reserve " << reserve;
    EXPECT_LE(moves, 3) << "reserve " << reserve;
    std::cout << "auto moved in " << moves << " of " << runs << ", by "
              << 100 * sum / runs << "% on average, " << 100 * worst
              << "% at most, over " << runs << " noisy profiles (reserve "
              << reserve << ")\n";
  }
}

// A recurrent layer is named in the reason with the bytes it keeps, as one
// op mutwo cannot split; a model without one gets no such note.
TEST(PlanRequestTest, NamesRecurrentLayersAsOneOp) {
  ScheduleRequest request;
  request.budget = *ParseBudget("60%");
  v1::Profile profile = mutwo::testing::ChainProfile(/*batch_size=*/2);
  auto plain = PlanSchedule(profile, request);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->reason().find("recurrent"), std::string::npos)
      << plain->reason();
  profile.mutable_nodes(3)->set_kind("aten::lstm");
  profile.mutable_nodes(3)->set_scope("encoder.lstm");
  auto s = PlanSchedule(profile, request);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE(s->reason().find(absl::StrCat("aten::lstm (encoder.lstm, ",
                                          FormatBytes(2 << 20),
                                          " kept for backward)")),
            std::string::npos)
      << s->reason();
  EXPECT_NE(s->reason().find("one op to mutwo"), std::string::npos);
}

TEST(PlanRequestTest, ResolvesEveryBudgetKind) {
  auto b = [](const char* text) { return *ParseBudget(text); };
  EXPECT_EQ(*ResolveBudget(b("60%"), 1000, 5000), 600);
  EXPECT_EQ(*ResolveBudget(b("10%dev"), 1000, 5000), 500);
  EXPECT_EQ(*ResolveBudget(b("4KiB"), 1000, 5000), 4096);
  EXPECT_FALSE(ResolveBudget(b("10%dev"), 1000, 0).ok());
  EXPECT_FALSE(ResolveBudget(v1::MemoryBudget(), 1000, 5000).ok());
}

TEST(PlanRequestTest, InfeasibleScheduleStatesTheFloor) {
  ScheduleRequest request;
  request.device_reserve = false;
  request.budget = *ParseBudget("100B");
  auto s = PlanSchedule(DiamondProto(), request);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->feasible());
  EXPECT_GT(s->floor_bytes(), 100);
  EXPECT_EQ(s->predicted_peak_bytes(), s->floor_bytes());
  EXPECT_NE(
      s->reason().find(absl::StrCat("the budget 100 B is below the floor ",
                                    FormatBytes(s->floor_bytes()),
                                    ", the lowest peak the mutwo "
                                    "policy reaches; baseline peak ")),
      std::string::npos)
      << s->reason();
}

// With the reserve, a refused budget is stated against the floor in the
// units of every other figure: not as byte counts, and not as the budget
// less the reserve (`budget of 8478597 bytes is below the lowest peak ...
// (28817797 bytes ...); planned for 8.09 MiB` beside `10% = 8.22 MiB`).
TEST(PlanRequestTest, InfeasibleScheduleStatesTheFloorWithTheReserve) {
  v1::Profile profile = DiamondProto();
  for (auto& a : *profile.mutable_activations())
    a.set_size_bytes(a.size_bytes() << 16);
  ScheduleRequest request;
  request.budget = *ParseBudget("10%");
  auto s = PlanSchedule(profile, request);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_FALSE(s->feasible());
  const int64_t floor_reserve =
      AllocatorReserveBytes(profile, s->floor_bytes());
  EXPECT_EQ(s->reason(),
            absl::StrCat("the budget ", FormatBytes(s->budget_bytes()),
                         " is below the floor ", FormatBytes(s->floor_bytes()),
                         ", the lowest peak the mutwo policy reaches, ",
                         FormatBytes(s->predicted_peak_bytes()),
                         ", plus a reserve of ", FormatBytes(floor_reserve),
                         " (16 KiB + 1.5% of the budget) for what the memory "
                         "model leaves out of replays; baseline peak ",
                         FormatBytes(s->baseline_peak_bytes())));
}

// On a CUDA device μ-TWO keeps 4 MiB + 1% of the budget free for the caching
// allocator's rounding, on the CPU 16 KiB + 1.5%; the baselines, and a request
// without the reserve, plan to the budget itself.
TEST(PlanRequestTest, CudaBudgetsKeepAnAllocatorReserve) {
  v1::Profile cuda = DiamondProto();
  cuda.mutable_device()->set_kind("cuda");
  const int64_t budget = int64_t{100} << 20;
  EXPECT_EQ(AllocatorReserveBytes(cuda, budget), (4 << 20) + budget / 100);
  EXPECT_EQ(AllocatorReserveBytes(DiamondProto(), budget),
            (16 << 10) + budget * 15 / 1000);

  ScheduleRequest request;
  request.budget = *ParseBudget("100%");
  ScheduleRequest no_reserve = request;
  no_reserve.device_reserve = false;
  auto cpu = PlanSchedule(DiamondProto(), no_reserve);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->feasible());
  // The whole profile is a few KB: a byte below its baseline peak nothing
  // is left after the reserve, and the floor is the baseline itself (the
  // unmodified step, which needs no reserve).
  request.budget.set_bytes(cpu->baseline_peak_bytes() - 1);
  auto tight = PlanSchedule(cuda, request);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_FALSE(tight->feasible());
  EXPECT_EQ(tight->budget_bytes(), cpu->baseline_peak_bytes() - 1);
  EXPECT_EQ(tight->floor_bytes(), cpu->baseline_peak_bytes());
  // Activations of MiBs: the floor is the lowest budget whose reserve
  // leaves the lowest peak.
  for (auto& a : *cuda.mutable_activations())
    a.set_size_bytes(a.size_bytes() << 20);
  no_reserve.budget = *ParseBudget("100%");
  cpu = PlanSchedule(cuda, no_reserve);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  request.budget.set_bytes(cpu->floor_bytes());
  tight = PlanSchedule(cuda, request);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_FALSE(tight->feasible());
  const int64_t floor = tight->floor_bytes();
  ASSERT_LT(floor, cpu->baseline_peak_bytes());
  EXPECT_GE(floor - AllocatorReserveBytes(cuda, floor), cpu->floor_bytes());
  EXPECT_LE(floor, cpu->floor_bytes() + (4 << 20) + floor / 100 + 2);
  request.budget.set_bytes(floor);
  auto fits = PlanSchedule(cuda, request);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_TRUE(fits->feasible());
  EXPECT_EQ(fits->budget_bytes(), floor);
  EXPECT_LE(fits->predicted_peak_bytes(),
            floor - AllocatorReserveBytes(cuda, floor));
  EXPECT_NE(fits->reason().find("reserve"), std::string::npos)
      << fits->reason();
  request.policy = v1::NONE;  // a fixed schedule: checked against the budget
  auto none = PlanSchedule(cuda, request);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->reason().find("reserve"), std::string::npos);
}

// The unmodified step fits any budget at or above its peak: such a budget
// is FITS with zero decisions on the CPU and on CUDA, whatever the reserve
// (which covers what replays leave out of the model), and the floor shown is
// never above the baseline peak (issue 25: a model where nothing is worth
// recomputing was called infeasible at a budget above its baseline).
TEST(PlanRequestTest, ABudgetAtOrAboveTheBaselinePeakFitsWithNoDecisions) {
  for (const char* kind : {"cpu", "cuda"}) {
    v1::Profile profile = DiamondProto();
    profile.mutable_device()->set_kind(kind);
    ScheduleRequest request;
    request.budget = *ParseBudget("100%");
    auto at = PlanSchedule(profile, request);
    ASSERT_TRUE(at.ok()) << at.status();
    const int64_t baseline = at->baseline_peak_bytes();
    for (int64_t budget : {baseline, baseline + 1, baseline + 4096}) {
      request.budget.set_bytes(budget);
      auto s = PlanSchedule(profile, request);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_TRUE(s->feasible())
          << kind << " " << budget << ": " << s->reason();
      for (const v1::Decision& d : s->decisions()) {
        EXPECT_EQ(d.action(), v1::Decision::RETAIN)
            << kind << " " << budget << ": value " << d.value_id();
      }
      EXPECT_EQ(s->predicted_peak_bytes(), baseline) << kind;
      EXPECT_LE(s->floor_bytes(), baseline) << kind;
    }
  }
}

// `floor` resolves to the lowest budget the plan is predicted to fit: the
// floor the same profile reports for any budget, feasible there, and one
// byte less is infeasible.
TEST(PlanRequestTest, FloorBudgetPlansAtTheFloor) {
  for (const char* kind : {"cpu", "cuda"}) {
    v1::Profile profile = DiamondProto();
    profile.mutable_device()->set_kind(kind);
    for (auto& a : *profile.mutable_activations())
      a.set_size_bytes(a.size_bytes() << 16);
    ScheduleRequest request;
    request.budget = *ParseBudget("60%");
    auto any = PlanSchedule(profile, request);
    ASSERT_TRUE(any.ok()) << any.status();
    request.budget = *ParseBudget("Floor");
    auto at = PlanSchedule(profile, request);
    ASSERT_TRUE(at.ok()) << at.status();
    EXPECT_EQ(at->budget().text(), "floor");
    EXPECT_TRUE(at->budget().floor());
    EXPECT_EQ(at->budget_bytes(), any->floor_bytes()) << kind;
    EXPECT_EQ(at->floor_bytes(), any->floor_bytes()) << kind;
    EXPECT_TRUE(at->feasible()) << kind << ": " << at->reason();
    EXPECT_LE(at->predicted_peak_bytes(), at->budget_bytes());
    EXPECT_LT(at->budget_bytes(), at->baseline_peak_bytes()) << kind;
    EXPECT_NE(at->reason().find("floor: the lowest predicted peak"),
              std::string::npos)
        << at->reason();
    request.budget = *ParseBudget(absl::StrCat(at->budget_bytes() - 1, "B"));
    auto below = PlanSchedule(profile, request);
    ASSERT_TRUE(below.ok()) << below.status();
    EXPECT_FALSE(below->feasible()) << kind;
  }
}

// The Pareto curve is listed by the budgets a user would give: its first
// budget is the floor the schedule reports, none lies below it, and each
// point's budget is the one `auto` would resolve to at that point (its plan
// fits with the reserve on top).
TEST(PlanRequestTest, ParetoBudgetsStartAtTheFloorWithTheReserve) {
  for (const char* kind : {"cpu", "cuda"}) {
    v1::Profile profile = DiamondProto();
    profile.mutable_device()->set_kind(kind);
    for (auto& a : *profile.mutable_activations())
      a.set_size_bytes(a.size_bytes() << 16);
    ScheduleRequest request;
    request.budget = *ParseBudget("60%");
    request.pareto_points = 20;
    auto s = PlanSchedule(profile, request);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_GE(s->pareto_size(), 2) << kind;
    EXPECT_EQ(s->pareto(0).budget_bytes(), s->floor_bytes()) << kind;
    for (const v1::ParetoPoint& p : s->pareto()) {
      EXPECT_GE(p.budget_bytes(), s->floor_bytes()) << kind;
      EXPECT_LE(p.budget_bytes(), s->baseline_peak_bytes()) << kind;
      EXPECT_LE(p.predicted_peak_bytes(), p.budget_bytes()) << kind;
      // Planned at its budget, the point's plan is what the curve says.
      ScheduleRequest at = request;
      at.pareto_points = 0;
      at.budget = *ParseBudget(absl::StrCat(p.budget_bytes(), "B"));
      auto planned = PlanSchedule(profile, at);
      ASSERT_TRUE(planned.ok()) << planned.status();
      EXPECT_TRUE(planned->feasible()) << kind << " " << p.budget_bytes();
      EXPECT_LE(planned->predicted_peak_bytes(), p.budget_bytes()) << kind;
    }
  }
}

// A correction learned from a validation plans that many bytes lower but
// keeps the budget the user asked for (what the worker measures against).
TEST(PlanRequestTest, CorrectionPlansBelowTheBudgetItKeeps) {
  ScheduleRequest request;
  request.device_reserve = false;
  request.budget = *ParseBudget("100%");
  auto plain = PlanSchedule(DiamondProto(), request);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(plain->feasible());
  EXPECT_EQ(plain->correction_bytes(), 0);
  const int64_t budget = plain->budget_bytes();
  const int64_t floor = plain->floor_bytes();
  ASSERT_LT(floor, budget);
  // Leaves exactly the floor.
  request.correction_bytes = budget - floor;
  auto corrected = PlanSchedule(DiamondProto(), request);
  ASSERT_TRUE(corrected.ok()) << corrected.status();
  EXPECT_TRUE(corrected->feasible()) << corrected->reason();
  EXPECT_EQ(corrected->budget_bytes(), budget);
  EXPECT_EQ(corrected->correction_bytes(), budget - floor);
  EXPECT_LE(corrected->predicted_peak_bytes(), floor);
  EXPECT_LT(corrected->predicted_peak_bytes(), plain->predicted_peak_bytes());
  EXPECT_NE(corrected->reason().find("below the budget"), std::string::npos);
  // One byte more: below the floor.
  request.correction_bytes = budget - floor + 1;
  auto infeasible = PlanSchedule(DiamondProto(), request);
  ASSERT_TRUE(infeasible.ok()) << infeasible.status();
  EXPECT_FALSE(infeasible->feasible());
  EXPECT_EQ(infeasible->budget_bytes(), budget);
  EXPECT_EQ(infeasible->floor_bytes(), floor);
  request.correction_bytes = -1;
  EXPECT_EQ(PlanSchedule(DiamondProto(), request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlanRequestTest, MaxBatchFromProfiles) {
  std::vector<v1::Profile> profiles;
  for (int64_t b : {2, 4}) {
    v1::Profile p = DiamondProto();
    p.set_batch_size(b);
    for (auto& a : *p.mutable_activations())
      a.set_size_bytes(a.size_bytes() * b);
    profiles.push_back(p);
  }
  // Baseline peak 1050 b; device 4 MiB, capacity 95%, less the CPU
  // allocator reserve at that capacity (16 KiB + 1.5%).
  for (v1::Profile& p : profiles) p.mutable_device()->set_total_bytes(4 << 20);
  const int64_t capacity = static_cast<int64_t>(0.95 * (4 << 20));
  const int64_t reserve = AllocatorReserveBytes(profiles[0], capacity);
  auto r = PredictMaxBatchProto(profiles, 0, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->capacity_bytes(), capacity);
  EXPECT_EQ(r->reserve_bytes(), reserve);
  EXPECT_EQ(r->fragmentation_fraction(), 0);
  EXPECT_EQ(r->max_batch_without_checkpointing(), (capacity - reserve) / 1050);
  // Thousands of samples from profiles at 2 and 4: the answer says so.
  EXPECT_DOUBLE_EQ(r->extrapolation(), r->max_batch_with_schedule() / 4.0);
  EXPECT_NE(r->reason().find("extrapolated"), std::string::npos) << r->reason();
  EXPECT_GE(r->max_batch_with_schedule(), r->max_batch_without_checkpointing());
  EXPECT_DOUBLE_EQ(r->max_overhead(), 0.25);
  EXPECT_EQ(r->profiled_batch_sizes_size(), 2);
  EXPECT_FALSE(r->verify_batch_sizes().empty());
}

// Profiles whose sizes are exactly linear in the batch size fit exactly:
// planning at batch 8 from profiles at 2 and 4 plans what the profile at 8
// plans, and the schedule says it extrapolated.
TEST(PlanRequestTest, PlanScheduleAtBatchPlansTheFittedProfile) {
  const std::vector<v1::Profile> profiles = {mutwo::testing::ChainProfile(2),
                                             mutwo::testing::ChainProfile(4)};
  ScheduleRequest request;
  request.budget = *ParseBudget("40MiB");  // baseline 4 MiB + 8 x 8 MiB
  auto at = PlanScheduleAtBatch(profiles, 8, request);
  ASSERT_TRUE(at.ok()) << at.status();
  auto direct = PlanSchedule(mutwo::testing::ChainProfile(8), request);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(at->batch_size(), 8);
  EXPECT_TRUE(at->feasible()) << at->reason();
  EXPECT_EQ(at->baseline_peak_bytes(), direct->baseline_peak_bytes());
  EXPECT_EQ(at->predicted_peak_bytes(), direct->predicted_peak_bytes());
  EXPECT_EQ(at->floor_bytes(), direct->floor_bytes());
  ASSERT_EQ(at->decisions_size(), direct->decisions_size());
  for (int k = 0; k < at->decisions_size(); ++k) {
    EXPECT_EQ(at->decisions(k).value_id(), direct->decisions(k).value_id());
    EXPECT_EQ(at->decisions(k).action(), direct->decisions(k).action()) << k;
  }
  EXPECT_GT(at->recomputed() + at->swapped(), 0);
  EXPECT_NE(at->reason().find("extrapolated to batch size 8 from profiles "
                              "at 2, 4"),
            std::string::npos)
      << at->reason();

  EXPECT_EQ(PlanScheduleAtBatch(profiles, 0, request).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PlanScheduleAtBatch({profiles[0]}, 8, request).ok());
}

}  // namespace
}  // namespace mutwo::planner
