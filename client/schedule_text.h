// The text form of a schedule's decisions, for `mutwo plan` and `mutwo
// schedule`: every activation recomputed or swapped, in node order, with
// its value id, producer node, op kind and module scope (when the profile
// is at hand), size and what the decision costs.
#ifndef MUTWO_CLIENT_SCHEDULE_TEXT_H_
#define MUTWO_CLIENT_SCHEDULE_TEXT_H_

#include <string>

#include "mutwo/v1/types.pb.h"

namespace mutwo {

// Two sections, "recomputed (N activations, S segments, X ms)" and
// "swapped (N activations, Y ms stalls)", each a table indented by
// `indent`; empty when every activation is retained. `profile` may be
// null (no op kinds then) or of another size (ids it lacks print `?`).
std::string DecisionsText(const v1::Schedule& schedule,
                          const v1::Profile* profile, int indent);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_SCHEDULE_TEXT_H_
