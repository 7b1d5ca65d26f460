// Fixed checkpointing schedules that the μ-TWO policy is compared against,
// evaluated by the same simulator:
//  - none: retain everything (the measured training step);
//  - sqrt_n: the op nodes that produce activations, in node order, cut into
//    ceil(sqrt(n)) long segments; the last node of each segment is retained
//    (the next segment's input), the others are recomputed (Chen et al.);
//  - per_block: a segment per top-level block of the module scopes (first
//    scope component, or the first two when the second is an index, as in
//    "layer1.0"); each block's last activation is retained. Nodes without a
//    scope are retained.
#ifndef MUTWO_PLANNER_BASELINES_H_
#define MUTWO_PLANNER_BASELINES_H_

#include <string>

#include "planner/model.h"

namespace mutwo::planner {

Decisions NoCheckpointing(const PlanProfile& profile);
Decisions SqrtNCheckpointing(const PlanProfile& profile);
Decisions PerBlockCheckpointing(const PlanProfile& profile);

// "layer1.0.conv1" -> "layer1.0"; "fc" -> "fc"; "" -> "".
std::string TopLevelBlock(const std::string& scope);

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_BASELINES_H_
