// TaskReports: the one guard every report of a task's result passes
// (ReportProfile, and ReportValidation for VALIDATE and MAX_BATCH tasks).
// A report names its task, the fence token of its lease and the worker
// that held it (ReportKey). Before anything is planned, Admit decides:
//   - a retry of a report stored whole the first time: answered OK, nothing
//     written (kRetried);
//   - the reporter holds the task (its lease, or one that expired with
//     nobody leasing the task since): taken (kTake), and Write stores it
//     in one transaction that completes the task first;
//   - anything else: refused with the store's reason (stale fence, not
//     leased, another worker's lease), nothing written.
// A report whose content the server refuses (a profile over a limit, the
// wrong kind of report for the task, a malformed profile) is Refused: when
// the reporter holds the task, the task is failed at once with the
// refusal's reason (retryable unless the report was over a limit: the same
// model measures the same) and its job settled, so that it neither waits
// for its lease to expire nor ends naming the lease.
//
// Ownership: the store is not owned and outlives the guard.
// Thread safety: every method is thread-safe (each is one transaction).
// Errors: FailedPrecondition or PermissionDenied from the store for a
// report of a lease that is not (or no longer) the reporter's; Aborted when
// the task changed while its report was read (retry); the store's errors;
// Refuse returns the refusal it was given.
#ifndef MUTWO_SERVER_TASK_REPORTS_H_
#define MUTWO_SERVER_TASK_REPORTS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mutwo/v1/types.pb.h"
#include "storage/store.h"

namespace mutwo {

// Which lease a report is for.
struct ReportKey {
  std::string task_id;
  int64_t fence_token = 0;
  std::string worker_id;

  // From any report request (ReportProfileRequest, ReportValidationRequest).
  template <typename Request>
  static ReportKey Of(const Request& request) {
    return ReportKey{request.task_id(), request.fence_token(),
                     request.worker_id()};
  }
};

class TaskReports {
 public:
  enum class Admission {
    kTake,     // plan what the report needs, then Write it
    kRetried,  // stored before: answer OK, write nothing
  };
  // Settles a job inside a transaction (job_settling.h).
  using SettleIn = std::function<absl::StatusOr<v1::Job>(
      storage::Store::Writer& w, const std::string& job_id)>;

  TaskReports(storage::Store* store, int max_attempts, SettleIn settle_in)
      : store_(store),
        max_attempts_(max_attempts),
        settle_in_(std::move(settle_in)) {}

  // Whether a report of `key` for `task` (as read before the report) is
  // taken; see above.
  [[nodiscard]] absl::StatusOr<Admission> Admit(const v1::Task& task,
                                                const ReportKey& key);
  // One report's transaction: completes the reported task with `result`,
  // then runs `body` with the same Writer. A report of a task completed
  // before (a retry that raced its first try) sets `*retried` and writes
  // nothing more.
  [[nodiscard]] absl::Status Write(
      const ReportKey& key, absl::string_view result, bool* retried,
      const std::function<absl::Status(storage::Store::Writer&)>& body);
  // A report of `task` whose content was refused with `refusal` (not OK):
  // fails the task when `key` holds it and sets `*settled` to its job as
  // settled; returns `refusal` either way.
  [[nodiscard]] absl::Status Refuse(const v1::Task& task, const ReportKey& key,
                                    absl::Status refusal,
                                    std::optional<v1::Job>* settled);

 private:
  storage::Store* store_;
  const int max_attempts_;
  const SettleIn settle_in_;
};

}  // namespace mutwo

#endif  // MUTWO_SERVER_TASK_REPORTS_H_
