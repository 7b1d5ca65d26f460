// What a plan recomputes without saying so: the executor runs a recompute
// segment as one range of IR nodes, [first replayed node, last member], in
// forward without autograd and again at its replay. An activation the plan
// RETAINs whose producer lies in that range (BatchNorm's output, when
// SiLU's in-place clone of it is recomputed: the replay must run the
// BatchNorm again) and that no node after the range reads in forward is not
// kept by the executor: it is dropped inside the range and rebuilt by the
// replay, exactly like a member, from what the segment holds anyway (also
// where the profiler would not let a policy recompute it: Swin's softmax
// behind the attention-mask `if`, 59 MB a block at batch 32). The planner's
// simulation kept it resident from forward to backward and over-predicted the
// peak by its size (up to 24% on EfficientNet on an H100).
//
// CloseOverReplays returns the decisions with such activations RECOMPUTEd,
// so that the simulation and the schedule describe what the executor runs.
// Their producers are replayed already: the replay's work is unchanged,
// though the simulation may now count the time of a node in the range that
// no member's lineage named.
#ifndef MUTWO_PLANNER_REPLAY_CLOSURE_H_
#define MUTWO_PLANNER_REPLAY_CLOSURE_H_

#include "planner/model.h"
#include "planner/simulator.h"

namespace mutwo::planner {

// `sim` is Simulator::Run's result for `decisions` (its segment_of).
// Returns `decisions` itself when nothing changes.
Decisions CloseOverReplays(const PlanProfile& profile,
                           const Decisions& decisions, const SimResult& sim);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_REPLAY_CLOSURE_H_
