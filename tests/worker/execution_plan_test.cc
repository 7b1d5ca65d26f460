// The schedule compiler (worker/execution_plan.h) on small graphs written
// as IR text: one case per pitfall its comments name, each asserting on
// the segments and swaps it compiles (ranges, inputs, outputs, what may be
// freed and when, tails, swap points). End to end, the executor tests run
// the same code on real models; here each rule is isolated.
#include "worker/execution_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mutwo/v1/types.pb.h"
#include "tests/worker/ir_graph.h"
#include "worker/graph.h"

namespace mutwo::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using worker::CompileSchedule;
using worker::ExecutionPlan;
using worker::SegmentPlan;

// Five sigmoids in a row: a(0) b(1) c(2) d(3) e(4).
constexpr char kChain[] = R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %b : Tensor = aten::sigmoid(%a)
  %c : Tensor = aten::sigmoid(%b)
  %d : Tensor = aten::sigmoid(%c)
  %e : Tensor = aten::sigmoid(%d)
  return (%e)
)IR";

ExecutionPlan Compile(const IrGraph& g, const v1::Schedule& schedule) {
  auto plan = CompileSchedule(*g.graph, schedule);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : ExecutionPlan{};
}

// The position of `v` among `values`, or -1.
int IndexOf(const std::vector<const torch::jit::Value*>& values,
            const torch::jit::Value* v) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] == v) return static_cast<int>(i);
  }
  return -1;
}

std::string Ranges(const ExecutionPlan& plan) {
  std::vector<std::string> out;
  for (const SegmentPlan& s : plan.segments) {
    out.push_back(absl::StrCat("[", s.first_node, ",", s.last_node, "]"));
  }
  return absl::StrJoin(out, " ");
}

// The one segment `schedule` compiles to on `g` (an empty one, after a
// failure, when there is not exactly one).
SegmentPlan OneSegment(const IrGraph& g, const v1::Schedule& schedule) {
  const ExecutionPlan plan = Compile(g, schedule);
  EXPECT_EQ(plan.segments.size(), 1u) << Ranges(plan);
  return plan.segments.size() == 1 ? plan.segments[0] : SegmentPlan{};
}

// A segment starts at the earliest node its activations are rebuilt from
// (a recompute node before the first member: b died in forward), not at
// its first member; what the range reads from before it is its input.
TEST(ExecutionPlanTest, RangeStartsAtTheEarliestRecomputeNode) {
  IrGraph g(kChain);
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "c", {"b", "c"});
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.first_node, g.id("b"));
  EXPECT_EQ(s.last_node, g.id("c"));
  EXPECT_THAT(s.members, ElementsAre(g.id("c")));
  EXPECT_THAT(s.inputs, ElementsAre(g.value("a")));
  EXPECT_THAT(s.copy_input, ElementsAre(false));
  EXPECT_THAT(s.outputs, ElementsAre(g.value("c")));
  EXPECT_THAT(s.freeable, ElementsAre(true));
  EXPECT_THAT(s.free_after, ElementsAre(g.id("d")));
  EXPECT_THAT(s.output_readers, ElementsAre(ElementsAre(g.id("d"))));
}

// `out = member; relu_(out)`: the range goes on over in-place writes of a
// member's output that follow it, so that the replay rebuilds the value
// autograd saved (after the write), not the one before it.
TEST(ExecutionPlanTest, RangeExtendsOverInPlaceWritesOfAMember) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %r : Tensor = aten::relu_(%a)
  %c : Tensor = aten::sigmoid(%r)
  return (%c)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRetain(g, &schedule, "c");
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.first_node, g.id("a"));
  EXPECT_EQ(s.last_node, g.id("r"));
  EXPECT_THAT(s.tail, IsEmpty());
}

// The extension stops at a node holding an activation of its own (ResNet's
// downsample before `out += identity; relu_(out)`): the in-place write
// after it is the segment's tail, which the replay applies to its outputs.
// Its output is then still freeable (the tail's write is replayed).
TEST(ExecutionPlanTest, InPlaceWritePastAnActivationIsTheTail) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %d : Tensor = aten::sigmoid(%a)
  %r : Tensor = aten::relu_(%a)
  %e : Tensor = aten::mul(%d, %r)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a", "r"});
  AddRetain(g, &schedule, "d");
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.first_node, g.id("a"));
  EXPECT_EQ(s.last_node, g.id("a"));
  EXPECT_THAT(s.tail, ElementsAre(g.id("r")));
  ASSERT_EQ(s.outputs.size(), 1u);
  EXPECT_THAT(s.written_after, ElementsAre(false));
  EXPECT_THAT(s.freeable, ElementsAre(true));
}

// A tail that captures a value written in place after it ran would replay
// from the later value: no tail then, and the member's output, written
// after the range by a node the replay does not apply, is not freed.
TEST(ExecutionPlanTest, TailReadingALaterWrittenValueIsDropped) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %d : Tensor = aten::sigmoid(%a)
  %m : Tensor = aten::mul_(%a, %d)
  %w : Tensor = aten::relu_(%d)
  %e : Tensor = aten::mul(%m, %w)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a", "m"});
  AddRetain(g, &schedule, "d");
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.last_node, g.id("a"));
  EXPECT_THAT(s.tail, IsEmpty());
  const int a = IndexOf(s.outputs, g.value("a"));
  ASSERT_GE(a, 0);
  EXPECT_TRUE(s.written_after[a]);
  EXPECT_FALSE(s.freeable[a]);
}

// A tail node inside another segment's range is run by that segment, not
// by the interpreter on its own, so it cannot be captured: no tail.
TEST(ExecutionPlanTest, TailInsideAnotherSegmentIsDropped) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %d : Tensor = aten::sigmoid(%a)
  %r : Tensor = aten::relu_(%a)
  %e : Tensor = aten::mul(%r, %d)
  %f : Tensor = aten::sigmoid(%e)
  return (%f)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a", "r"}, /*segment=*/0);
  AddRecompute(g, &schedule, "d", {"d"}, /*segment=*/1);
  AddRecompute(g, &schedule, "e", {"r", "e"}, /*segment=*/1);
  const ExecutionPlan plan = Compile(g, schedule);
  ASSERT_EQ(plan.segments.size(), 2u) << Ranges(plan);
  EXPECT_EQ(plan.segments[0].last_node, g.id("a"));
  EXPECT_EQ(plan.segments[1].first_node, g.id("d"));
  EXPECT_EQ(plan.segments[1].last_node, g.id("e"));
  EXPECT_THAT(plan.segments[0].tail, IsEmpty());
}

// Groups whose lineages overlap (d is rebuilt from b, which the first
// group replays: GPT's attention output from the q/k/v of the previous
// group) run as one segment.
TEST(ExecutionPlanTest, GroupsWithOverlappingLineagesAreMerged) {
  IrGraph g(kChain);
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "b", {"a", "b"}, /*segment=*/0);
  AddRecompute(g, &schedule, "d", {"b", "c", "d"}, /*segment=*/1);
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.first_node, g.id("a"));
  EXPECT_EQ(s.last_node, g.id("d"));
  EXPECT_THAT(s.members, ElementsAre(g.id("b"), g.id("d")));
  EXPECT_EQ(s.recomputed, 2);
}

// A range extended over an in-place write may reach the next group's first
// recompute node: ranges are clipped, never overlap.
TEST(ExecutionPlanTest, RangesAreClippedSoThatTheyNeverOverlap) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %r : Tensor = aten::relu_(%a)
  %c : Tensor = aten::sigmoid(%r)
  %d : Tensor = aten::sigmoid(%c)
  return (%d)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"}, /*segment=*/0);
  AddRecompute(g, &schedule, "c", {"r", "c"}, /*segment=*/1);
  const ExecutionPlan plan = Compile(g, schedule);
  ASSERT_EQ(plan.segments.size(), 2u) << Ranges(plan);
  EXPECT_EQ(plan.segments[0].first_node, g.id("a"));
  EXPECT_EQ(plan.segments[0].last_node, g.id("r"));
  EXPECT_EQ(plan.segments[1].first_node, g.id("c"));
  EXPECT_EQ(plan.segments[1].last_node, g.id("c"));
}

// A node in the range that is no member and writes in place into a value
// made before the range (ResNet's `out += identity`) would make the
// segment keep a copy the planner does not count: the group runs as two
// segments split at that node, which runs as an ordinary op.
TEST(ExecutionPlanTest, SplitsAtAnInPlaceWriteIntoAValueFromBeforeTheRange) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %i : Tensor = aten::sigmoid(%x)
  %a : Tensor = aten::sigmoid(%x)
  %b : Tensor = aten::sigmoid(%a)
  %w : Tensor = aten::mul_(%i, %b)
  %d : Tensor = aten::sigmoid(%w)
  %e : Tensor = aten::sigmoid(%d)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRecompute(g, &schedule, "b", {"b"});
  AddRecompute(g, &schedule, "d", {"d"});
  const ExecutionPlan plan = Compile(g, schedule);
  ASSERT_EQ(plan.segments.size(), 2u) << Ranges(plan);
  EXPECT_EQ(plan.segments[0].first_node, g.id("a"));
  EXPECT_EQ(plan.segments[0].last_node, g.id("b"));
  EXPECT_EQ(plan.segments[0].recomputed, 2);
  EXPECT_EQ(plan.segments[1].first_node, g.id("d"));
  EXPECT_EQ(plan.segments[1].last_node, g.id("d"));
  EXPECT_EQ(plan.segments[1].recomputed, 1);
  EXPECT_EQ(plan.SegmentHolding(g.id("w")), -1);
}

// Buffers a module updates in place (BatchNorm's counter) are restored
// around replays by the segment itself: a write into one does not split.
TEST(ExecutionPlanTest, DoesNotSplitAtAnInPlaceWriteIntoABuffer) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %n : Tensor = prim::GetAttr[name="num_batches_tracked"](%self)
  %a : Tensor = aten::sigmoid(%x)
  %w : Tensor = aten::mul_(%n, %a)
  %b : Tensor = aten::sigmoid(%a)
  %e : Tensor = aten::sigmoid(%b)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRecompute(g, &schedule, "b", {"b"});
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.first_node, g.id("a"));
  EXPECT_EQ(s.last_node, g.id("b"));
}

// A list from before the range that the range appends to (torchvision's
// IntermediateLayerGetter filling a feature dict) does not split it: it is
// an output, written back into the same object, when it is read after.
TEST(ExecutionPlanTest, ListWrittenInTheRangeAndReadAfterIsWrittenBack) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %dim : int = prim::Constant[value=0]()
  %l : Tensor[] = prim::ListConstruct(%x)
  %a : Tensor = aten::sigmoid(%x)
  %n : Tensor[] = aten::append(%l, %a)
  %b : Tensor = aten::sigmoid(%a)
  %c : Tensor = aten::cat(%l, %dim)
  %e : Tensor = aten::mul(%c, %b)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRecompute(g, &schedule, "b", {"b"});
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.first_node, g.id("a"));
  EXPECT_EQ(s.last_node, g.id("b"));
  const int l = IndexOf(s.outputs, g.value("l"));
  ASSERT_GE(l, 0) << "the list the range appends to is no output";
  EXPECT_TRUE(s.container_output[l]);
  EXPECT_FALSE(s.freeable[l]);
}

// A list that dies inside the range (LRASPP's head reads features["low"]
// and ["high"] in the range that wrote "high") is not written back, even
// though what was taken out of it is read after the range.
TEST(ExecutionPlanTest, ListDyingInTheRangeIsNotWrittenBack) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %zero : int = prim::Constant[value=0]()
  %l : Tensor[] = prim::ListConstruct(%x)
  %a : Tensor = aten::sigmoid(%x)
  %n : Tensor[] = aten::append(%l, %a)
  %g : Tensor = aten::__getitem__(%l, %zero)
  %b : Tensor = aten::sigmoid(%g)
  %e : Tensor = aten::sigmoid(%b)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRecompute(g, &schedule, "g", {"g"});
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.last_node, g.id("g"));
  EXPECT_GE(IndexOf(s.inputs, g.value("l")), 0);
  // (b, after the range, reads what came out of the list.)
  EXPECT_EQ(IndexOf(s.outputs, g.value("l")), -1);
  for (bool c : s.container_output) EXPECT_FALSE(c);
}

// An input the graph writes in place after the range (or in it) has
// changed by the time the replay reads it: the segment keeps a copy.
TEST(ExecutionPlanTest, InputWrittenInPlaceAfterTheRangeIsCopied) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %i : Tensor = aten::sigmoid(%x)
  %a : Tensor = aten::mul(%i, %i)
  %b : Tensor = aten::sigmoid(%a)
  %w : Tensor = aten::relu_(%i)
  %e : Tensor = aten::mul(%b, %w)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRetain(g, &schedule, "b");
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_THAT(s.inputs, ElementsAre(g.value("i")));
  EXPECT_THAT(s.copy_input, ElementsAre(true));
}

// The storage of an output belongs to the first member on its alias chain
// (a view made after a member shares the member's storage: ShuffleNet's
// view(contiguous(...))); an output whose chain reaches no member (a
// recompute node's, p) is not the segment's to free.
TEST(ExecutionPlanTest, FreeableOutputsAreThoseAMemberOwns) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %p : Tensor = aten::sigmoid(%x)
  %a : Tensor = aten::sigmoid(%x)
  %v : Tensor = aten::t(%a)
  %m : Tensor = aten::mul(%p, %a)
  %r : Tensor = aten::mul(%v, %p)
  %s : Tensor = aten::mul(%r, %m)
  return (%s)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRecompute(g, &schedule, "m", {"p", "m"});
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_EQ(s.first_node, g.id("p"));
  EXPECT_EQ(s.last_node, g.id("m"));
  const int p = IndexOf(s.outputs, g.value("p"));
  const int v = IndexOf(s.outputs, g.value("v"));
  const int m = IndexOf(s.outputs, g.value("m"));
  ASSERT_GE(p, 0);
  ASSERT_GE(v, 0);
  ASSERT_GE(m, 0);
  EXPECT_FALSE(s.freeable[p]);
  EXPECT_TRUE(s.freeable[v]);
  EXPECT_TRUE(s.freeable[m]);
  EXPECT_THAT(s.output_readers[p], IsEmpty());
  EXPECT_THAT(s.output_readers[v], ElementsAre(g.id("r")));
}

// Values forward returns are read by the loss: never freed.
TEST(ExecutionPlanTest, ReturnedOutputsAreNotFreeable) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %b : Tensor = aten::sigmoid(%a)
  %c : Tensor = aten::sigmoid(%b)
  return (%c, %b)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "b", {"a", "b"});
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_THAT(s.outputs, ElementsAre(g.value("b")));
  EXPECT_THAT(s.freeable, ElementsAre(false));
}

// An output written in place after the range, by a node the replay does
// not apply, differs from what the replay computes: not freeable.
TEST(ExecutionPlanTest, OutputWrittenAfterTheRangeIsNotFreeable) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %d : Tensor = aten::sigmoid(%a)
  %r : Tensor = aten::relu_(%a)
  %e : Tensor = aten::mul(%d, %r)
  return (%e)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  AddRetain(g, &schedule, "d");
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_THAT(s.tail, IsEmpty());
  EXPECT_THAT(s.written_after, ElementsAre(true));
  EXPECT_THAT(s.freeable, ElementsAre(false));
}

// An output is freed after its last read through any view of it (v = a.t()
// read at r), and the readers of the view need the replay too.
TEST(ExecutionPlanTest, OutputIsFreedAfterTheLastReadThroughAView) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %v : Tensor = aten::t(%a)
  %q : Tensor = aten::sigmoid(%x)
  %r : Tensor = aten::mul(%v, %q)
  %s : Tensor = aten::sigmoid(%r)
  return (%s)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "a", {"a"});
  const SegmentPlan s = OneSegment(g, schedule);
  ASSERT_THAT(s.outputs, ElementsAre(g.value("a")));
  EXPECT_THAT(s.free_after, ElementsAre(g.id("r")));
  EXPECT_THAT(s.output_readers[0], ElementsAre(g.id("v"), g.id("r")));
}

// Tensors read by GetAttr inside the range are named by their attribute
// path from `self` (the segment reads the module's slot at run time); a
// GetAttr chain rooted elsewhere names nothing.
TEST(ExecutionPlanTest, AttributePathsAreReadFromSelf) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor, %other : Tensor):
  %sub : int = prim::GetAttr[name="sub"](%self)
  %w : Tensor = prim::GetAttr[name="weight"](%sub)
  %o : Tensor = prim::GetAttr[name="bias"](%other)
  %a : Tensor = aten::mul(%x, %w)
  %b : Tensor = aten::mul(%a, %o)
  %c : Tensor = aten::sigmoid(%b)
  return (%c)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "b", {"sub", "w", "o", "a", "b"});
  const SegmentPlan s = OneSegment(g, schedule);
  EXPECT_THAT(s.attribute_paths, ElementsAre(ElementsAre("sub", "weight")));
}

// A swap leaves after the last forward read of any view of the output
// (not the planner's offload point, before it) and takes those views
// along; the copy back starts at a backward prefetch point.
TEST(ExecutionPlanTest, SwapLeavesAfterTheLastReadThroughAView) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %v : Tensor = aten::t(%a)
  %q : Tensor = aten::sigmoid(%x)
  %r : Tensor = aten::mul(%v, %q)
  %s : Tensor = aten::sigmoid(%r)
  return (%s)
)IR");
  const int n = g.graph->num_nodes();
  v1::Schedule schedule;
  v1::Decision* d = schedule.add_decisions();
  d->set_action(v1::Decision::SWAP);
  d->set_producer_node(g.id("a"));
  d->set_offload_after(g.id("v"));
  d->set_prefetch_at(n + 1);  // a backward position
  d->set_prefetch_node(g.id("s"));
  const ExecutionPlan plan = Compile(g, schedule);
  ASSERT_EQ(plan.swaps.size(), 1u);
  const worker::SwapPlan& swap = plan.swaps[0];
  EXPECT_EQ(swap.planned_offload_after, g.id("v"));
  EXPECT_EQ(swap.offload_after, g.id("r"));
  EXPECT_THAT(swap.readers, ElementsAre(g.id("v"), g.id("r")));
  EXPECT_THAT(swap.values, ElementsAre(g.value("a"), g.value("v")));
  EXPECT_EQ(swap.prefetch_node, g.id("s"));

  // A prefetch point in forward is no backward step: the copy back starts
  // at the first backward use.
  d->set_prefetch_at(g.id("q"));
  const ExecutionPlan forward_prefetch = Compile(g, schedule);
  ASSERT_EQ(forward_prefetch.swaps.size(), 1u);
  EXPECT_EQ(forward_prefetch.swaps[0].prefetch_node, -1);
}

// Returned outputs feed the loss: they cannot leave during forward.
TEST(ExecutionPlanTest, ReturnedOutputsAreNotSwapped) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %b : Tensor = aten::sigmoid(%a)
  return (%b, %a)
)IR");
  v1::Schedule schedule;
  v1::Decision* d = schedule.add_decisions();
  d->set_action(v1::Decision::SWAP);
  d->set_producer_node(g.id("a"));
  d->set_offload_after(g.id("b"));
  EXPECT_THAT(Compile(g, schedule).swaps, IsEmpty());
}

// A tensor put in a tuple is read where it is taken out and used (Hugging
// Face's traced T5 layer norm returns (x, normed), which the feed-forward
// unpacks into its linear), not only by the TupleConstruct: it is freed
// after that use, and the use's backward needs the replay.
TEST(ExecutionPlanTest, TupleElementIsReadWhereItIsUnpacked) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor, %w : Tensor):
  %one : int = prim::Constant[value=1]()
  %h : Tensor = aten::sigmoid(%x)
  %n : Tensor = aten::sigmoid(%h)
  %t : (Tensor, Tensor) = prim::TupleConstruct(%h, %n)
  %hu : Tensor, %nu : Tensor = prim::TupleUnpack(%t)
  %l : Tensor = aten::mm(%nu, %w)
  %o : Tensor = aten::add(%l, %hu, %one)
  return (%o)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "n", {"n"});
  const SegmentPlan s = OneSegment(g, schedule);
  ASSERT_THAT(s.outputs, ElementsAre(g.value("n")));
  EXPECT_THAT(s.freeable, ElementsAre(true));
  EXPECT_THAT(s.free_after, ElementsAre(g.id("l")));
  EXPECT_THAT(s.output_readers[0],
              ElementsAre(g.id("t"), g.id("hu"), g.id("l")));
}

// Through nested tuples and prim::TupleIndex, the readers are the nodes
// reading a tuple that holds the tensor and those of the values taken out
// at its own position (not those of the other elements: `o` reads only h).
TEST(ExecutionPlanTest, TupleElementIsFollowedThroughNestedTuples) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor, %w : Tensor):
  %zero : int = prim::Constant[value=0]()
  %one : int = prim::Constant[value=1]()
  %h : Tensor = aten::sigmoid(%x)
  %n : Tensor = aten::sigmoid(%h)
  %inner : (Tensor, Tensor) = prim::TupleConstruct(%h, %n)
  %outer : ((Tensor, Tensor), Tensor) = prim::TupleConstruct(%inner, %x)
  %got : (Tensor, Tensor) = prim::TupleIndex(%outer, %zero)
  %hh : Tensor = prim::TupleIndex(%got, %zero)
  %nn : Tensor = prim::TupleIndex(%got, %one)
  %o : Tensor = aten::sigmoid(%hh)
  %v : Tensor = aten::t(%nn)
  %l : Tensor = aten::mm(%v, %w)
  %r : Tensor = aten::add(%l, %o, %one)
  return (%r)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "n", {"n"});
  const SegmentPlan s = OneSegment(g, schedule);
  ASSERT_THAT(s.outputs, ElementsAre(g.value("n")));
  EXPECT_THAT(s.free_after, ElementsAre(g.id("l")));
  EXPECT_THAT(s.output_readers[0],
              ElementsAre(g.id("inner"), g.id("outer"), g.id("got"), g.id("hh"),
                          g.id("nn"), g.id("v"), g.id("l")));
}

// A tensor forward returns inside a tuple is read by the loss: never freed
// (and never swapped out during forward).
TEST(ExecutionPlanTest, ReturnedInsideATupleIsNotFreeable) {
  IrGraph g(R"IR(
graph(%self : Tensor, %x : Tensor):
  %a : Tensor = aten::sigmoid(%x)
  %b : Tensor = aten::sigmoid(%a)
  %c : Tensor = aten::sigmoid(%b)
  %t : (Tensor, Tensor) = prim::TupleConstruct(%c, %b)
  return (%t)
)IR");
  v1::Schedule schedule;
  AddRecompute(g, &schedule, "b", {"b"});
  const SegmentPlan s = OneSegment(g, schedule);
  ASSERT_THAT(s.outputs, ElementsAre(g.value("b")));
  EXPECT_THAT(s.freeable, ElementsAre(false));

  v1::Schedule swap;
  v1::Decision* d = swap.add_decisions();
  d->set_value_id(1);
  d->set_action(v1::Decision::SWAP);
  d->set_producer_node(g.id("b"));
  d->set_offload_after(g.id("t"));
  EXPECT_THAT(Compile(g, swap).swaps, IsEmpty());
}

// Decisions naming nodes the graph does not have are refused, naming the
// decision: a producer, a recompute node, an offload point.
TEST(ExecutionPlanTest, DecisionsNamingUnknownNodesAreRefused) {
  IrGraph g(kChain);
  const int n = g.graph->num_nodes();
  auto refusal = [&](const v1::Schedule& schedule) {
    auto plan = CompileSchedule(*g.graph, schedule);
    EXPECT_FALSE(plan.ok());
    return plan.ok() ? std::string() : std::string(plan.status().message());
  };
  {
    v1::Schedule s;
    AddRecompute(g, &s, "b", {"b"});
    s.mutable_decisions(0)->set_producer_node(n);
    EXPECT_THAT(refusal(s), ::testing::HasSubstr("decisions[0]"));
  }
  {
    v1::Schedule s;
    AddRecompute(g, &s, "b", {"b"});
    s.mutable_decisions(0)->add_recompute_nodes(-1);
    EXPECT_THAT(refusal(s), ::testing::HasSubstr("node -1"));
  }
  {
    v1::Schedule s;
    v1::Decision* d = s.add_decisions();
    d->set_action(v1::Decision::SWAP);
    d->set_producer_node(g.id("c"));
    d->set_offload_after(g.id("b"));  // before the producer
    EXPECT_THAT(refusal(s), ::testing::HasSubstr("offload_after"));
  }
}

}  // namespace
}  // namespace mutwo::testing
