// Jobs that wait for a device no live worker has: a job asks for a device
// kind (JobSpec.device_kind: "cpu", "cuda", or "" for any), and its queued
// tasks can only be leased by a worker of that kind that is IDLE or BUSY
// (a LOST worker missed its heartbeats). These pure functions say when that
// is not the case, for `mutwo job` (Job.waiting) and for the
// mutwo_jobs_waiting_for_device gauge. No state; thread-compatible.
#ifndef MUTWO_SERVER_DEVICE_WAIT_H_
#define MUTWO_SERVER_DEVICE_WAIT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "mutwo/v1/types.pb.h"

namespace mutwo {

// The gauge's label for a job's device kind: "any" for "".
std::string DeviceKindLabel(absl::string_view device_kind);

// Why a job with queued tasks for `device_kind` cannot be leased now, or ""
// when some live worker can take them. E.g. "no cuda worker registered",
// "no live cuda worker (2 registered, all lost: missed heartbeats)".
std::string DeviceWaitReason(absl::string_view device_kind,
                             const std::vector<v1::WorkerInfo>& workers);

// From the number of unfinished jobs with queued tasks per device kind
// (Store::CountJobsWithQueuedTasksByDeviceKind), those no live worker can
// run, by label. "cpu", "cuda" and "any" are always present (0 when none),
// so an alert on the series has data from the start.
std::map<std::string, int64_t> JobsWaitingForDevice(
    const std::map<std::string, int64_t>& queued_jobs_by_device_kind,
    const std::vector<v1::WorkerInfo>& workers);

}  // namespace mutwo

#endif  // MUTWO_SERVER_DEVICE_WAIT_H_
