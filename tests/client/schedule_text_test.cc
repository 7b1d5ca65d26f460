#include "client/schedule_text.h"

#include <cstdint>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using ::testing::HasSubstr;

v1::Schedule TwoDecisions() {
  v1::Schedule s;
  v1::Decision* r = s.add_decisions();
  r->set_value_id(11);
  r->set_action(v1::Decision::RECOMPUTE);
  r->set_producer_node(4);
  r->set_size_bytes(2048);
  r->set_segment(0);
  r->set_needed_at(30);
  r->set_recompute_ms(0.5);
  v1::Decision* w = s.add_decisions();
  w->set_value_id(12);
  w->set_action(v1::Decision::SWAP);
  w->set_producer_node(7);
  w->set_size_bytes(3 << 20);
  w->set_offload_after(8);
  w->set_prefetch_at(25);
  w->set_stall_ms(0.25);
  v1::Decision* keep = s.add_decisions();
  keep->set_value_id(13);
  keep->set_action(v1::Decision::RETAIN);
  keep->set_producer_node(9);
  return s;
}

TEST(DecisionsText, ListsWhatIsRecomputedAndWhatIsSwapped) {
  v1::Profile profile;
  for (int i = 0; i < 10; ++i) {
    v1::ProfileNode* n = profile.add_nodes();
    n->set_id(i);
    n->set_kind(i == 4 ? "aten::relu" : i == 7 ? "aten::conv2d" : "prim::X");
    n->set_scope(i == 4 ? "layer1.relu" : i == 7 ? "layer2.conv" : "");
  }
  const std::string text = DecisionsText(TwoDecisions(), &profile, 2);
  EXPECT_THAT(text, HasSubstr("  recomputed: 1 activations (2.00 KiB) in 1 "
                              "segments, 0.500 ms (each segment's replay "
                              "once"));
  EXPECT_THAT(text, HasSubstr("  swapped: 1 activations (3.00 MiB), 0.250 ms "
                              "stalls\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "layer1.relu +aten::relu +\\? +11 +4 +2.00 KiB +0 +30 "
                        "+0.500"));
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "layer2.conv +aten::conv2d +\\? +12 +7 +3.00 MiB +8 "
                        "+25 +0.250"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("13")));  // retained
}

// Every decision of a segment carries the segment's replay time: the total
// counts it once, so that baseline + recompute + stalls = planned.
TEST(DecisionsText, RecomputeTimeCountsEachSegmentOnce) {
  v1::Schedule s;
  for (int i = 0; i < 3; ++i) {
    v1::Decision* d = s.add_decisions();
    d->set_value_id(i);
    d->set_action(v1::Decision::RECOMPUTE);
    d->set_segment(i < 2 ? 0 : 1);
    d->set_recompute_ms(i < 2 ? 4.0 : 1.0);  // the segment's replay
  }
  EXPECT_THAT(DecisionsText(s, nullptr, 0),
              HasSubstr("in 2 segments, 5.000 ms"));
  s.set_predicted_recompute_ms(5.5);  // the planner's own total wins
  EXPECT_THAT(DecisionsText(s, nullptr, 0),
              HasSubstr("in 2 segments, 5.500 ms"));
}

// The floor is a budget: printed with the budget, not on the peak line; the
// Pareto curve is listed by budget, its first budget the floor, so that no
// figure looks like a point below the floor.
TEST(ScheduleText, FloorBesideTheBudgetAndParetoByBudget) {
  v1::Schedule s;
  s.mutable_budget()->set_text("60%");
  s.set_budget_bytes(60 << 20);
  s.set_feasible(true);
  s.set_floor_bytes(40 << 20);
  s.set_baseline_peak_bytes(100 << 20);
  s.set_predicted_peak_bytes(58 << 20);
  s.set_baseline_iteration_ms(66.36);
  s.set_predicted_iteration_ms(79.15);
  s.set_predicted_recompute_ms(12.79);
  v1::ParetoPoint* p = s.add_pareto();
  p->set_budget_bytes(40 << 20);
  p->set_predicted_peak_bytes(39 << 20);
  p->set_predicted_iteration_ms(90);
  const std::string text = ScheduleText(s, nullptr, "predicted", 2);
  EXPECT_THAT(text, HasSubstr("  budget          60% = 60.00 MiB; floor 40.00 "
                              "MiB (the lowest budget that fits; "
                              "predicted)\n"));
  EXPECT_THAT(text,
              HasSubstr("  peak            baseline 100.00 MiB -> planned "
                        "58.00 MiB (-42.0%)\n"));
  EXPECT_THAT(text, HasSubstr("iteration       baseline 66.360 ms -> planned "
                              "79.150 ms (+19.3%: recompute 12.790 ms"));
  EXPECT_THAT(text, HasSubstr("the first budget is the floor"));
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "budget +40.00 MiB -> +39.00 MiB +90.000 ms"));
  // The floor appears on the budget line only.
  const size_t budget_line_end = text.find('\n');
  const std::string pareto_note = "the first budget is the floor";
  EXPECT_EQ(text.find("floor", budget_line_end),
            text.find(pareto_note) + pareto_note.size() - 5);
}

// `auto` resolves to a budget above the lowest at which its plan fits, the
// budget its Pareto point is listed by: the point is marked, or a reader
// finds `auto = 60.11 MiB` on no row of the curve.
TEST(ScheduleText, MarksTheParetoPointThatIsThisSchedule) {
  v1::Schedule s;
  s.mutable_budget()->set_text("auto");
  s.set_budget_bytes(63026008);
  s.set_feasible(true);
  s.set_baseline_peak_bytes(100 << 20);
  s.set_baseline_iteration_ms(100);
  s.set_predicted_peak_bytes(58 << 20);
  s.set_predicted_iteration_ms(105.5);
  for (const auto& [budget, peak, ms] :
       std::vector<std::tuple<int64_t, int64_t, double>>{
           {40 << 20, 39 << 20, 120},
           {59 << 20, 58 << 20, 105.5},
           {100 << 20, 100 << 20, 100}}) {
    v1::ParetoPoint* p = s.add_pareto();
    p->set_budget_bytes(budget);
    p->set_predicted_peak_bytes(peak);
    p->set_predicted_iteration_ms(ms);
  }
  const std::string text = ScheduleText(s, nullptr, "", 0);
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "budget +59.00 MiB -> +58.00 MiB +105.500 ms .*"
                        "  <- this schedule \\(budget auto = 60.11 MiB\\)\n"));
  const size_t mark = text.find("<- this schedule");
  EXPECT_EQ(text.find("<- this schedule", mark + 1), std::string::npos);
  // An infeasible schedule is no point of the curve.
  s.set_feasible(false);
  EXPECT_THAT(ScheduleText(s, nullptr, "", 0),
              ::testing::Not(HasSubstr("<- this schedule")));
}

// A budget below the floor is refused: the schedule's plan is the floor's,
// said so, and its decisions are not listed as an answer to the budget.
TEST(ScheduleText, ARefusedBudgetShowsTheFloorNotItsDecisions) {
  v1::Schedule s = TwoDecisions();
  s.mutable_budget()->set_text("10%");
  s.set_budget_bytes(8 << 20);
  s.set_feasible(false);
  s.set_floor_bytes(28 << 20);
  s.set_baseline_peak_bytes(82 << 20);
  s.set_predicted_peak_bytes(27 << 20);
  s.set_recomputed(1);
  s.set_swapped(1);
  const std::string text = ScheduleText(s, nullptr, "", 2);
  EXPECT_THAT(text, HasSubstr("  feasible        NO: the budget is below the "
                              "floor; the peak and time below are the "
                              "floor's plan\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("recomputed:")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("swapped:")));
  EXPECT_THAT(text, HasSubstr("--budget floor"));
  s.set_feasible(true);
  s.set_budget_bytes(28 << 20);
  EXPECT_THAT(ScheduleText(s, nullptr, "", 2), HasSubstr("recomputed:"));
}

TEST(DecisionsText, WithoutAProfileIdsAndSizesRemain) {
  const std::string text = DecisionsText(TwoDecisions(), nullptr, 0);
  EXPECT_THAT(
      text, ::testing::ContainsRegex("\\(model\\) +\\? +\\? +11 +4 +2.00 KiB"));
  v1::Schedule none;
  EXPECT_EQ(DecisionsText(none, nullptr, 0), "");
}

// Schedules name the module, op and output themselves: a user
// reading `mutwo schedule` finds `layer3.4.conv2` in the model without the
// profile, and the decision's names win over a profile's.
TEST(DecisionsText, PrintsTheDecisionsModulePathOpAndOutput) {
  v1::Schedule s = TwoDecisions();
  s.mutable_decisions(0)->set_module_path("layer3.4.conv2");
  s.mutable_decisions(0)->set_op_kind("aten::conv2d");
  s.mutable_decisions(0)->set_output_index(0);
  s.mutable_decisions(1)->set_module_path("");
  s.mutable_decisions(1)->set_op_kind("aten::flatten");
  s.mutable_decisions(1)->set_output_index(-1);
  v1::Profile other;  // a profile whose names differ: ignored
  for (int i = 0; i < 10; ++i) {
    other.add_nodes()->set_id(i);
    other.mutable_nodes(i)->set_kind("prim::Other");
    other.mutable_nodes(i)->set_scope("other");
  }
  for (const v1::Profile* profile :
       {static_cast<v1::Profile*>(nullptr), &other}) {
    const std::string text = DecisionsText(s, profile, 0);
    EXPECT_THAT(text, ::testing::ContainsRegex(
                          "layer3.4.conv2 +aten::conv2d +0 +11 +4 +2.00 KiB"));
    EXPECT_THAT(text, ::testing::ContainsRegex(
                          "\\(model\\) +aten::flatten +- +12 +7 +3.00 MiB"));
    EXPECT_THAT(text, ::testing::Not(HasSubstr("prim::Other")));
  }
}

}  // namespace
}  // namespace mutwo
