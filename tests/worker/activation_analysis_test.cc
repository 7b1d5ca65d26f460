// The profiler's liveness and lineage analysis on hand-built records: no
// model, no LibTorch. Each graph is written out node by node as the
// profiler would record it (graph.h's edges, the storages each node's
// outputs expose, what was alive at the end of forward, what backward freed).
#include "worker/activation_analysis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace mutwo::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A graph being written out: node by node, then the step's memory.
class Records {
 public:
  // Adds node `id` (ids in order from 0), reading the outputs of `inputs`,
  // its tensor outputs on `storages` (empty: no tensor output), alive at the
  // end of forward or not.
  Records& Node(int id, std::vector<int> inputs,
                std::vector<uintptr_t> storages, bool alive = true) {
    EXPECT_EQ(id, static_cast<int>(nodes_.size())) << "nodes in order";
    LineageNode node;
    node.input_nodes = inputs;
    node.last_use = id;  // nothing reads it yet
    for (int input : inputs) {
      LineageNode& producer = nodes_[input];
      producer.consumers.push_back(id);
      producer.last_use = id;
    }
    nodes_.push_back(node);
    step_.output_storages.push_back(std::move(storages));
    step_.outputs_alive.push_back(alive);
    return *this;
  }
  // Which output each of node `id`'s storages came from.
  Records& OutputIndices(int id, std::vector<int> indices) {
    step_.output_indices.resize(nodes_.size());
    step_.output_indices[id] = std::move(indices);
    return *this;
  }
  Records& WritesInPlace(int id) {
    nodes_[id].writes_in_place = true;
    return *this;
  }
  Records& ReadsMutatedContainer(int id) {
    nodes_[id].reads_mutated_container = true;
    return *this;
  }
  // An allocation alive at the end of forward, made at position `tag`.
  Records& Live(uintptr_t address, int64_t bytes, int64_t tag) {
    step_.live_at_end_of_forward.push_back({address, bytes, tag});
    return *this;
  }
  // Backward steps in execution order: the node each one belongs to.
  Records& Steps(std::vector<int> forward_nodes) {
    step_.step_forward_node = std::move(forward_nodes);
    return *this;
  }
  // `address` freed while position `tag` ran.
  Records& Freed(uintptr_t address, int64_t tag) {
    step_.frees.push_back({address, tag});
    return *this;
  }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  ActivationAnalysis Analyze() const {
    return AnalyzeActivations(nodes_, step_);
  }

 private:
  std::vector<LineageNode> nodes_;
  StepMemoryRecord step_;
};

constexpr uintptr_t kA = 0xa000, kB = 0xb000, kC = 0xc000, kD = 0xd000,
                    kMask = 0xe000, kLoss = 0xf000, kParam = 0x1000;

// The activation `producer` made (a failure, and producer_node -1, if none).
ActivationRecord Of(const ActivationAnalysis& analysis, int producer) {
  for (const ActivationRecord& a : analysis.activations) {
    if (a.producer_node == producer) return a;
  }
  ADD_FAILURE() << "no activation made by node " << producer;
  ActivationRecord none;
  none.producer_node = -1;
  return none;
}

// x -> a=relu (kept) -> b=linear (died) -> c=relu (kept) -> d=add(a, c).
Records Chain() {
  Records r;
  r.Node(0, {}, {kA})
      .Node(1, {0}, {kB}, /*alive=*/false)
      .Node(2, {1}, {kC})
      .Node(3, {0, 2}, {kD});
  return r;
}

TEST(ActivationAnalysisTest, LiveBlocksOfForwardNodesAreActivationsByProducer) {
  Records r = Chain();
  r.Live(kC, 50, 2)
      .Live(kA, 100, 0)
      .Live(kLoss, 8, kLossTag)
      .Live(kParam, 1000, kIdleTag)
      .Steps({3, 2, 1, 0});
  const ActivationAnalysis analysis = r.Analyze();
  ASSERT_EQ(analysis.activations.size(), 2u);
  // In producer order, value ids numbered in that order.
  EXPECT_EQ(analysis.activations[0].producer_node, 0);
  EXPECT_EQ(analysis.activations[0].value_id, 0);
  EXPECT_EQ(analysis.activations[0].size_bytes, 100);
  EXPECT_EQ(analysis.activations[1].producer_node, 2);
  EXPECT_EQ(analysis.activations[1].value_id, 1);
  EXPECT_EQ(analysis.activations[1].size_bytes, 50);
  EXPECT_EQ(analysis.tracked_bytes, 150);
  EXPECT_EQ(analysis.loss_bytes, 8);
}

// Decisions name the producer's output holding the activation:
// max-pool with indices keeps both outputs, dropout only its mask.
TEST(ActivationAnalysisTest, ReportsWhichOutputsHoldTheActivation) {
  Records r;
  r.Node(0, {}, {kA, kB})  // (values, indices)
      .Node(1, {0}, {kC})  // dropout: output died, its mask lives
      .Node(2, {1}, {kD});
  r.OutputIndices(0, {0, 1}).OutputIndices(1, {0}).OutputIndices(2, {0});
  r.Live(kB, 10, 0).Live(kMask, 20, 1).Live(kD, 30, 2).Steps({2, 1, 0});
  const ActivationAnalysis analysis = r.Analyze();
  EXPECT_THAT(Of(analysis, 0).output_indices, ElementsAre(1));
  EXPECT_THAT(Of(analysis, 1).output_indices, IsEmpty());
  EXPECT_THAT(Of(analysis, 2).output_indices, ElementsAre(0));
  // Records without indices (hand-built elsewhere) report none.
  Records old = Chain();
  old.Live(kA, 100, 0).Steps({3, 2, 1, 0});
  EXPECT_THAT(Of(old.Analyze(), 0).output_indices, IsEmpty());
}

TEST(ActivationAnalysisTest, LastForwardUseIsTheLastReaderAndTheFreeEndsIt) {
  // a is read by nodes 1 and 3; backward runs 3, 2, 1, 0 (positions 4..7)
  // and frees c during node 2's step (5), a during node 0's (7).
  Records r = Chain();
  r.Live(kA, 100, 0).Live(kC, 50, 2).Steps({3, 2, 1, 0});
  r.Freed(kC, 5).Freed(kA, 7);
  const ActivationAnalysis analysis = r.Analyze();
  const ActivationRecord a = Of(analysis, 0);
  const ActivationRecord c = Of(analysis, 2);
  EXPECT_EQ(a.last_forward_use, 3);
  EXPECT_EQ(a.last_backward_use, 7);
  // Needed from the first backward step of its consumers (node 3's, 4).
  EXPECT_EQ(a.first_backward_use, 4);
  EXPECT_EQ(c.last_forward_use, 3);
  EXPECT_EQ(c.first_backward_use, 4);
  EXPECT_EQ(c.last_backward_use, 5);
}

TEST(ActivationAnalysisTest, NotFreedInBackwardCountsAsTheLastStep) {
  // a is never freed; c is freed after backward (an idle tag).
  Records r = Chain();
  r.Live(kA, 100, 0).Live(kC, 50, 2).Steps({3, 2, 1, 0});
  r.Freed(kC, kIdleTag);
  const ActivationAnalysis analysis = r.Analyze();
  EXPECT_EQ(Of(analysis, 0).last_backward_use, 7);
  EXPECT_EQ(Of(analysis, 2).last_backward_use, 7);
}

TEST(ActivationAnalysisTest,
     WithoutABackwardStepOfItsUsersItIsNeededAtTheFree) {
  // Backward ran one step, node 2's (position 4), during which a was freed;
  // no step of a's producer or readers ran: its first backward use is
  // clamped to its last.
  Records r = Chain();
  r.Live(kA, 100, 0).Steps({2, -1}).Freed(kA, 4);
  const ActivationAnalysis analysis = r.Analyze();
  const ActivationRecord a = Of(analysis, 0);
  EXPECT_EQ(a.first_backward_use, 4);
  EXPECT_EQ(a.last_backward_use, 4);
}

TEST(ActivationAnalysisTest, AViewSharesItsBaseStorage) {
  // v = a.view(...) at node 1 (same storage); only node 3 reads v. a's
  // last forward use is node 3, and node 3's backward needs it.
  Records r;
  r.Node(0, {}, {kA})
      .Node(1, {0}, {kA})
      .Node(2, {}, {kB})
      .Node(3, {1, 2}, {kC})
      .Node(4, {3}, {kD});
  r.Live(kA, 100, 0).Steps({4, 3, 2, 1, 0});
  const ActivationAnalysis analysis = r.Analyze();
  ASSERT_EQ(analysis.activations.size(), 1u);  // the view made nothing
  const ActivationRecord& a = analysis.activations[0];
  EXPECT_EQ(a.producer_node, 0);
  EXPECT_EQ(a.last_forward_use, 3);
  EXPECT_EQ(a.first_backward_use, 6);  // 5 nodes + 1: node 3's step
}

TEST(ActivationAnalysisTest, BlocksOutsideTheOutputStoragesAreUnswappable) {
  // Dropout at node 0: its output and its mask, both saved.
  Records r = Chain();
  r.Live(kA, 100, 0).Live(kMask, 25, 0).Steps({3, 2, 1, 0});
  const ActivationAnalysis analysis = r.Analyze();
  const ActivationRecord a = Of(analysis, 0);
  EXPECT_EQ(a.size_bytes, 125);
  EXPECT_EQ(a.unswappable_bytes, 25);
  EXPECT_EQ(a.storages, 2);
}

TEST(ActivationAnalysisTest, LineageWalksBackThroughDeadOutputsToKeptOnes) {
  // c = relu(linear(a)): the linear's output died, so c's replay runs it
  // and reads a (a source).
  Records r = Chain();
  r.Live(kA, 100, 0).Live(kC, 50, 2).Steps({3, 2, 1, 0});
  const ActivationAnalysis analysis = r.Analyze();
  const ActivationRecord c = Of(analysis, 2);
  EXPECT_THAT(c.recompute_nodes, ElementsAre(1, 2));
  EXPECT_THAT(c.recompute_sources, ElementsAre(Of(analysis, 0).value_id));
  EXPECT_EQ(c.mutated_container_reader, -1);
  const ActivationRecord a = Of(analysis, 0);
  EXPECT_THAT(a.recompute_nodes, ElementsAre(0));
  EXPECT_THAT(a.recompute_sources, IsEmpty());
}

TEST(ActivationAnalysisTest, NonTensorInputsStopTheWalk) {
  // An int (no storage) produced by node 0 and a dead tensor by node 1.
  Records r;
  r.Node(0, {}, {}, /*alive=*/true)
      .Node(1, {}, {kB}, /*alive=*/false)
      .Node(2, {0, 1}, {kC});
  r.Live(kC, 50, 2).Steps({2});
  const ActivationAnalysis analysis = r.Analyze();
  EXPECT_THAT(Of(analysis, 2).recompute_nodes, ElementsAre(1, 2));
}

// EfficientNet's `silu_(bn(x))`: node 0 (batch norm) makes s, node 1 writes
// it in place and saves a copy of what it read (k, its activation).
Records SiluAfterBatchNorm(bool silu_in_place) {
  Records r;
  r.Node(0, {}, {kA}).Node(1, {0}, {kA}).Node(2, {1}, {kC});
  if (silu_in_place) r.WritesInPlace(1);
  r.Live(kA, 100, 0).Live(kB, 100, 1).Live(kC, 10, 2).Steps({2, 1, 0});
  return r;
}

TEST(ActivationAnalysisTest, AKeptStorageOverwrittenInPlaceReplaysItsProducer) {
  // s holds the value after silu_, not the one silu_'s replay must read:
  // the batch norm is replayed too, s is no source.
  const ActivationAnalysis analysis = SiluAfterBatchNorm(true).Analyze();
  const ActivationRecord copy = Of(analysis, 1);
  EXPECT_THAT(copy.recompute_nodes, ElementsAre(0, 1));
  EXPECT_THAT(copy.recompute_sources, IsEmpty());
  // The batch norm's own activation is written by node 1 after it: the
  // replay applies the write.
  EXPECT_THAT(Of(analysis, 0).recompute_nodes, ElementsAre(0, 1));
}

TEST(ActivationAnalysisTest, AKeptStorageNotWrittenInPlaceIsASource) {
  // The same graph with an out-of-place node 1 sharing the storage (a view):
  // s holds what node 1 read, so it is a source.
  const ActivationAnalysis analysis = SiluAfterBatchNorm(false).Analyze();
  const ActivationRecord copy = Of(analysis, 1);
  EXPECT_THAT(copy.recompute_nodes, ElementsAre(1));
  EXPECT_THAT(copy.recompute_sources, ElementsAre(Of(analysis, 0).value_id));
  EXPECT_THAT(Of(analysis, 0).recompute_nodes, ElementsAre(0));
}

TEST(ActivationAnalysisTest, InPlaceWritesAfterTheProducerJoinItsReplay) {
  // ResNet's block end: identity i (node 0, kept), conv (1, died), bn2
  // (2, kept: p), `p += i` (3) and `relu_(p)` (4) write p in place. bn2's
  // replay applies both writes, rebuilds the conv, and reads i.
  Records r;
  r.Node(0, {}, {kA})
      .Node(1, {}, {kB}, /*alive=*/false)
      .Node(2, {1}, {kC})
      .Node(3, {0, 2}, {kC})
      .Node(4, {3}, {kC})
      .Node(5, {4}, {kD});
  r.WritesInPlace(3).WritesInPlace(4);
  r.Live(kA, 100, 0).Live(kC, 100, 2).Live(kD, 10, 5);
  r.Steps({5, 4, 3, 2, 1, 0});
  const ActivationAnalysis analysis = r.Analyze();
  const ActivationRecord p = Of(analysis, 2);
  EXPECT_THAT(p.recompute_nodes, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(p.recompute_sources, ElementsAre(Of(analysis, 0).value_id));
  // Read through the in-place results until node 5.
  EXPECT_EQ(p.last_forward_use, 5);
}

TEST(ActivationAnalysisTest, AReplayReadingAMutatedContainerIsNamed) {
  // The dead linear (node 1) reads a list the graph appends to.
  Records r = Chain();
  r.ReadsMutatedContainer(1).ReadsMutatedContainer(3);
  r.Live(kA, 100, 0).Live(kC, 50, 2).Steps({3, 2, 1, 0});
  const ActivationAnalysis analysis = r.Analyze();
  EXPECT_EQ(Of(analysis, 2).mutated_container_reader, 1);
  // Node 3 reads one too, but no replay runs it.
  EXPECT_EQ(Of(analysis, 0).mutated_container_reader, -1);
}

}  // namespace
}  // namespace mutwo::worker
