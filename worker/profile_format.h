// Text forms of a v1::Profile for `mutwo-worker profile --output csv|text`
// (JSON is common/proto_io.h ProtoToJson). Torch-free; stateless.
#ifndef MUTWO_WORKER_PROFILE_FORMAT_H_
#define MUTWO_WORKER_PROFILE_FORMAT_H_

#include <string>

#include "mutwo/v1/types.pb.h"

namespace mutwo::worker {

// Two CSV tables separated by one empty line: the nodes (one row per IR
// node) and the activations (one row per activation). Headers are the proto
// field names; repeated fields are joined with ';'.
std::string FormatProfileCsv(const v1::Profile& profile);

// A human summary: device, fixed memory, step totals and peaks, the
// correctness check, and the largest activations.
std::string FormatProfileText(const v1::Profile& profile);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_PROFILE_FORMAT_H_
