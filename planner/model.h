// Plain structs the planner works on: a training step's timeline (forward IR
// nodes, then backward steps), the activations held between forward and
// backward, and one decision per activation. Built from a v1::Profile by
// proto_convert.h, or by hand in tests and benchmarks.
//
// Timeline: forward node i is position i; backward step k is position
// nodes.size() + k. All *_use fields are positions.
#ifndef MUTWO_PLANNER_MODEL_H_
#define MUTWO_PLANNER_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace mutwo::planner {

struct PlanNode {
  double forward_ms = 0;
  // Host time of the node's run (ProfileNode.host_ms; 0 where the profile
  // has none): a replay takes the larger of its forward and host times.
  double host_ms = 0;
  // Allocator figures measured by the profiler; both 0 in a profile without
  // them (the simulator then derives the curve from fixed memory and the
  // activations' lifetimes).
  int64_t allocated_bytes_after = 0;
  int64_t peak_bytes_during = 0;
  // Bytes the op needs only while it runs (ProfileNode.transient_bytes):
  // a replay of the node needs them again.
  int64_t transient_bytes = 0;
  // Tensor operator (not a constant, attribute read or list construction):
  // only op nodes split recompute segments.
  bool is_op = true;
  std::string scope;  // "layer1.0.conv1"; used by the per_block policy
};

struct PlanBackwardStep {
  double ms = 0;
  int forward_node = -1;
  int64_t allocated_bytes_after = 0;
  int64_t peak_bytes_during = 0;
};

struct PlanActivation {
  int value_id = 0;  // the profile's id, echoed in schedules
  int producer_node = 0;
  int64_t size_bytes = 0;
  int last_forward_use = 0;
  int first_backward_use = 0;
  int last_backward_use = 0;  // freed after this position
  double inactive_ms = 0;
  double recompute_ms = 0;  // stand-alone replay time of recompute_nodes
  double swap_ms = 0;       // device->host + host->device transfer time
  // A SWAP can move (nearly) all of it: it is held by the producer's output
  // storages (Activation.unswappable_bytes <= 1% of the size).
  bool swappable = true;
  // A replay can rebuild it (Activation.not_recomputable is empty).
  bool recomputable = true;
  // Indices into PlanProfile::activations (not value ids) of the activations
  // needed to rebuild this one.
  std::vector<int> recompute_sources;
  std::vector<int> recompute_nodes;  // node ids replayed, in id order
};

struct PlanProfile {
  std::vector<PlanNode> nodes;
  std::vector<PlanBackwardStep> backward_steps;
  std::vector<PlanActivation> activations;
  // Parameters + gradients + optimizer state + inputs. Part of the measured
  // allocator figures already; added explicitly only to a derived curve.
  int64_t fixed_bytes = 0;
  int64_t measured_peak_bytes = 0;
  double measured_iteration_ms = 0;  // 0: sum of node and step times
  // Host cost of one segment's replay beyond its ops
  // (MeasuredStep.replay_overhead_ms; 0 where the profile has none).
  double replay_overhead_ms = 0;
  int64_t device_total_bytes = 0;
  // Pinned-copy bandwidths; 0 (CPU) means swapping is impossible.
  double host_to_device_bytes_per_second = 0;
  double device_to_host_bytes_per_second = 0;

  int positions() const {
    return static_cast<int>(nodes.size() + backward_steps.size());
  }
  bool HasAllocatorFigures() const;
  // Where a copy issued at `position` starts on the device: the executor
  // issues it before the first backward step of the step's forward node (it
  // hooks every autograd node that node made), so a position inside a run
  // of steps of one forward node (ConvolutionBackward0, then its weight's
  // AccumulateGrad) moves to the run's first step. Forward positions stay.
  int IssuePosition(int position) const {
    int k = position - static_cast<int>(nodes.size());
    if (k <= 0 || k >= static_cast<int>(backward_steps.size())) {
      return position;
    }
    const int node = backward_steps[k].forward_node;
    while (k > 0 && node >= 0 && backward_steps[k - 1].forward_node == node) {
      --k;
    }
    return static_cast<int>(nodes.size()) + k;
  }
  bool CanSwap() const {
    return host_to_device_bytes_per_second > 0 &&
           device_to_host_bytes_per_second > 0;
  }
};

enum class Action { kRetain, kRecompute, kSwap };

const char* ActionName(Action action);

struct Decision {
  Action action = Action::kRetain;
  // SWAP: position at whose start the prefetch is issued; -1 means "at the
  // first backward use" (no overlap).
  int prefetch_at = -1;

  bool operator==(const Decision& other) const {
    return action == other.action && prefetch_at == other.prefetch_at;
  }
  bool operator!=(const Decision& other) const { return !(*this == other); }
};

// One decision per activation, indexed like PlanProfile::activations.
using Decisions = std::vector<Decision>;

enum class Policy { kMutwo, kSqrtN, kPerBlock, kNone };

const char* PolicyName(Policy policy);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_MODEL_H_
