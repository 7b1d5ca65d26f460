// The plot data `mutwo plot` hands to the renderer: the timeline is over
// time and its curve is the high-water mark during each position (a
// transient the profile measured shows, though nothing holds it after the
// op), the planned step is longer by its replays, an infeasible schedule
// says so; the batch data carries predicted and measured series per
// budget, the infeasible requests, capacity and max batch; the Pareto data
// has mutwo's curve beside sqrt_n and per_block.
#include "client/plot_data.h"

#include <algorithm>

#include "common/parse.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "planner/plan_request.h"
#include "tests/testing/synthetic_profile.h"

namespace mutwo {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using ::testing::HasSubstr;

const Value& Field(const Struct& s, const std::string& key) {
  static const Value kNull;
  auto it = s.fields().find(key);
  EXPECT_NE(it, s.fields().end()) << key;
  return it == s.fields().end() ? kNull : it->second;
}

std::vector<double> Numbers(const Value& v) {
  std::vector<double> out;
  for (const Value& x : v.list_value().values())
    out.push_back(x.number_value());
  return out;
}

const Struct* Series(const Struct& data, const std::string& role,
                     const std::string& source) {
  for (const Value& s : Field(data, "series").list_value().values()) {
    const Struct& st = s.struct_value();
    if (Field(st, "role").string_value() == role &&
        Field(st, "source").string_value() == source) {
      return &st;
    }
  }
  return nullptr;
}

v1::Profile ProfileWithTransient() {
  v1::Profile p = testing::ChainProfile(4);
  // Node 3 needs 3 MiB of workspace while it runs.
  p.mutable_nodes(3)->set_peak_bytes_during(p.nodes(3).allocated_bytes_after() +
                                            (3 << 20));
  p.mutable_nodes(3)->set_transient_bytes(3 << 20);
  return p;
}

v1::Schedule Plan(const v1::Profile& profile, const std::string& budget,
                  v1::Policy policy = v1::MUTWO, int pareto_points = 0) {
  planner::ScheduleRequest request;
  request.budget = *ParseBudget(budget);
  request.policy = policy;
  request.pareto_points = pareto_points;
  request.device_reserve = false;
  auto schedule = planner::PlanSchedule(profile, request);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return *schedule;
}

TEST(TimelinePlotDataTest, TimeAxisAndPeakDuringEachOp) {
  const v1::Profile profile = ProfileWithTransient();
  const v1::Schedule schedule = Plan(profile, "60%");
  ASSERT_TRUE(schedule.feasible()) << schedule.reason();
  ASSERT_GT(schedule.recomputed() + schedule.swapped(), 0);
  const Struct data = TimelinePlotData(schedule, profile, "chain");
  EXPECT_EQ(Field(data, "format").string_value(), kPlotDataFormat);
  EXPECT_EQ(Field(data, "kind").string_value(), "timeline");
  EXPECT_TRUE(Field(data, "feasible").bool_value());

  const Struct* baseline = Series(data, "baseline", "simulated");
  const Struct* planned = Series(data, "planned", "simulated");
  const Struct* measured = Series(data, "baseline", "measured");
  ASSERT_NE(baseline, nullptr);
  ASSERT_NE(planned, nullptr);
  ASSERT_NE(measured, nullptr);
  const std::vector<double> end = Numbers(Field(*baseline, "end_ms"));
  // 8 forward ops of 1 ms, 8 backward steps: time, increasing.
  ASSERT_EQ(end.size(), 16u);
  EXPECT_DOUBLE_EQ(end[0], 1.0);
  EXPECT_TRUE(std::is_sorted(end.begin(), end.end()));
  EXPECT_DOUBLE_EQ(Field(*baseline, "backward_start_ms").number_value(), 8.0);
  // The planned step replays what it recomputes: it ends later.
  const std::vector<double> planned_end = Numbers(Field(*planned, "end_ms"));
  EXPECT_GT(planned_end.back(), end.back());
  // The curve is the high-water mark during each op: node 3's workspace
  // is in the peak, not in the bytes after it.
  const std::vector<double> peak = Numbers(Field(*baseline, "peak_bytes"));
  const std::vector<double> after = Numbers(Field(*baseline, "after_bytes"));
  EXPECT_DOUBLE_EQ(peak[3] - after[3], 3 << 20);
  const std::vector<double> planned_peak =
      Numbers(Field(*planned, "peak_bytes"));
  EXPECT_DOUBLE_EQ(*std::max_element(planned_peak.begin(), planned_peak.end()),
                   static_cast<double>(schedule.predicted_peak_bytes()));
  EXPECT_DOUBLE_EQ(Numbers(Field(*measured, "peak_bytes"))[3],
                   static_cast<double>(profile.nodes(3).peak_bytes_during()));
  // Activations: a recomputed one lives twice in the planned step.
  int twice = 0;
  for (const Value& a : Field(data, "activations").list_value().values()) {
    const Struct& st = a.struct_value();
    if (Field(st, "action").string_value() == "RECOMPUTE") {
      EXPECT_EQ(Field(st, "planned").list_value().values_size(), 2);
      ++twice;
    }
  }
  EXPECT_EQ(twice, schedule.recomputed());
}

TEST(TimelinePlotDataTest, InfeasibleScheduleSaysWhy) {
  const v1::Profile profile = ProfileWithTransient();
  const v1::Schedule schedule = Plan(profile, "1KiB");
  ASSERT_FALSE(schedule.feasible());
  const Struct data = TimelinePlotData(schedule, profile, "chain");
  EXPECT_FALSE(Field(data, "feasible").bool_value());
  EXPECT_FALSE(Field(data, "reason").string_value().empty());
  EXPECT_GT(Field(data, "predicted_peak_bytes").number_value(),
            Field(data, "budget_bytes").number_value());
}

TEST(BatchPlotDataTest, SeriesInfeasibleCapacityAndMaxBatch) {
  v1::Job job;
  job.mutable_spec()->set_model_name("chain");
  *job.mutable_spec()->add_budgets() = *ParseBudget("60%");
  *job.mutable_spec()->add_budgets() = *ParseBudget("1KiB");
  for (int64_t batch : {4, 8}) {
    const v1::Profile profile = testing::ChainProfile(batch);
    v1::BatchResult* r = job.add_results();
    r->set_batch_size(batch);
    r->set_baseline_peak_bytes(profile.nodes(7).allocated_bytes_after());
    for (const char* budget : {"60%", "1KiB"}) {
      const v1::Schedule s = Plan(profile, budget);
      *r->add_schedules() = s;
      v1::BudgetOutcome* o = r->add_outcomes();
      o->set_budget_bytes(s.budget_bytes());
      if (s.feasible()) {
        o->set_state(v1::BudgetOutcome::FITS);
        o->set_measured_peak_bytes(s.predicted_peak_bytes() + 100);
      } else {
        o->set_state(v1::BudgetOutcome::INFEASIBLE);
      }
    }
  }
  job.mutable_max_batch()->set_capacity_bytes(int64_t{1} << 30);
  job.mutable_max_batch()->set_max_batch_without_checkpointing(120);
  job.mutable_max_batch()->set_max_batch_with_schedule(200);
  job.mutable_max_batch()->mutable_without_checkpointing_check()->set_state(
      v1::MaxBatchCheck::VERIFIED);
  job.mutable_max_batch()->mutable_with_schedule_check()->set_state(
      v1::MaxBatchCheck::FAILED);
  const Struct data = BatchPlotData(job);
  std::vector<std::string> names;
  for (const Value& s : Field(data, "series").list_value().values()) {
    names.push_back(Field(s.struct_value(), "name").string_value());
  }
  EXPECT_THAT(names, ::testing::Contains(HasSubstr("baseline")));
  EXPECT_THAT(names, ::testing::Contains("budget 60%: predicted"));
  EXPECT_THAT(names, ::testing::Contains("budget 60%: measured"));
  const auto& infeasible = Field(data, "infeasible").list_value().values();
  ASSERT_EQ(infeasible.size(), 2);  // 1KiB at both batch sizes
  EXPECT_EQ(Field(infeasible[0].struct_value(), "budget").string_value(),
            "1.00 KiB");
  const Struct& mb = Field(data, "max_batch").struct_value();
  EXPECT_EQ(Field(mb, "capacity_bytes").number_value(), 1 << 30);
  EXPECT_EQ(Field(mb, "with").number_value(), 200);
  // Proved by a step, or only predicted.
  EXPECT_TRUE(Field(mb, "without_verified").bool_value());
  EXPECT_FALSE(Field(mb, "with_verified").bool_value());
  // The JSON the renderer reads parses back.
  Struct parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(PlotDataJson(data), &parsed)
          .ok());
  EXPECT_EQ(Field(parsed, "kind").string_value(), "batch");
}

TEST(ParetoPlotDataTest, CurveBesideSqrtNAndPerBlock) {
  const v1::Profile profile = testing::ChainProfile(4);
  const v1::Schedule mutwo = Plan(profile, "60%", v1::MUTWO, 6);
  ASSERT_GE(mutwo.pareto_size(), 2);
  const Struct data = ParetoPlotData(
      mutwo,
      {Plan(profile, "60%", v1::SQRT_N), Plan(profile, "60%", v1::PER_BLOCK)},
      "chain");
  std::map<std::string, int> points;
  for (const Value& s : Field(data, "series").list_value().values()) {
    const Struct& st = s.struct_value();
    points[Field(st, "policy").string_value() + ":" +
           Field(st, "name").string_value()] =
        Field(st, "points").list_value().values_size();
  }
  EXPECT_EQ(points["mutwo:mutwo: Pareto curve over budgets"],
            mutwo.pareto_size());
  EXPECT_EQ(points["sqrt_n:sqrt_n"], 1);
  EXPECT_EQ(points["per_block:per_block"], 1);
  const Struct& base = Field(data, "baseline").struct_value();
  EXPECT_EQ(Field(base, "peak_bytes").number_value(),
            static_cast<double>(mutwo.baseline_peak_bytes()));
  EXPECT_GT(Field(base, "iteration_ms").number_value(), 0);
  // The floor always; the knee only with the job's result.
  EXPECT_EQ(Field(data, "floor_bytes").number_value(),
            static_cast<double>(mutwo.floor_bytes()));
  EXPECT_FALSE(data.fields().contains("knee"));
  v1::BatchResult r;
  r.set_baseline_iteration_ms(12);
  r.set_plan_baseline_iteration_ms(10);
  r.mutable_knee()->set_budget_bytes(3 << 20);
  r.mutable_knee()->set_predicted_peak_bytes(2 << 20);
  r.mutable_knee()->set_predicted_iteration_ms(11);
  const Struct with_knee = ParetoPlotData(mutwo, {}, "chain", &r);
  const Struct& knee = Field(with_knee, "knee").struct_value();
  EXPECT_EQ(Field(knee, "budget_bytes").number_value(), 3 << 20);
  EXPECT_EQ(Field(knee, "peak_bytes").number_value(), 2 << 20);
  // Against the baseline the knee was planned against (10 ms), not 12.
  EXPECT_NEAR(Field(knee, "overhead").number_value(), 0.1, 1e-9);
}

}  // namespace
}  // namespace mutwo
