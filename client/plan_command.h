// `mutwo plan PROFILE.json --budget B [--policy P] [--pareto]
// [--output json|text]`: plans a schedule offline from a profile file (the
// JSON a worker's `profile` command writes), without a server.
//
// Exit codes: 0 planned and feasible; 2 bad arguments or a bad profile file
// (the reason names the file and the field); 3 the budget is below the
// floor (the schedule is still printed, and the floor on stderr).
#ifndef MUTWO_CLIENT_PLAN_COMMAND_H_
#define MUTWO_CLIENT_PLAN_COMMAND_H_

#include "common/args.h"

namespace mutwo {

int PlanCommand(const ParsedArgs& args);

// `mutwo max-batch PROFILE.json PROFILE.json [...] [--capacity B]
// [--max_overhead F]`: the largest batch that fits, predicted offline from
// profiles of one model at two or more batch sizes.
int MaxBatchCommand(const ParsedArgs& args);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_PLAN_COMMAND_H_
