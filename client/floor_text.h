// The floor as `mutwo job` shows it, per batch size: the floor a worker
// measured (the job asked for `--budget floor`), else the planner's
// prediction, unless a worker measured a budget at or above the prediction
// over after the closed loop's rounds (no schedule mutwo has fits it): then
// the floor is only known to lie above that budget, and no budget a worker
// measured over is shown as the floor.
#ifndef MUTWO_CLIENT_FLOOR_TEXT_H_
#define MUTWO_CLIENT_FLOOR_TEXT_H_

#include <string>

#include "mutwo/v1/types.pb.h"

namespace mutwo {

// "3.71 GiB measured", "> 3.70 GiB measured" or "3.60 GiB predicted".
std::string FloorText(const v1::BatchResult& result);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_FLOOR_TEXT_H_
