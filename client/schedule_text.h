// The text form of a schedule's decisions, for `mutwo plan` and `mutwo
// schedule`: every activation recomputed or swapped, in node order, with
// its value id, producer node, op kind and module scope (when the profile
// is at hand), size and what the decision costs.
#ifndef MUTWO_CLIENT_SCHEDULE_TEXT_H_
#define MUTWO_CLIENT_SCHEDULE_TEXT_H_

#include <string>

#include "mutwo/v1/types.pb.h"

namespace mutwo {

// The figures of a schedule, one per line, each where it belongs: the
// budget with the floor (both budgets: the floor is the lowest budget that
// fits, `floor_source` says how it is known), the peak and the iteration
// time each baseline -> planned, the time split into the baseline plus the
// recompute (each segment once) plus the stalls, the decisions' counts, the
// planner's note, then DecisionsText and the Pareto curve as budget ->
// planned peak and time (its first budget is the floor; a planned peak may
// lie below its budget by the allocator reserve). Lines start with
// `indent` spaces.
std::string ScheduleText(const v1::Schedule& schedule,
                         const v1::Profile* profile,
                         const std::string& floor_source, int indent);

// Two sections, "recomputed (N activations, S segments, X ms)" and
// "swapped (N activations, Y ms stalls)", each a table indented by
// `indent`; empty when every activation is retained. `profile` may be
// null (no op kinds then) or of another size (ids it lacks print `?`).
std::string DecisionsText(const v1::Schedule& schedule,
                          const v1::Profile* profile, int indent);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_SCHEDULE_TEXT_H_
