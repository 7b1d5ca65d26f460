// Interrupt: tells the planner's long loops to give up, because the time
// allowed is over (a deadline) or because the caller left (a cancellation
// callback: the server passes grpc::ServerContext::IsCancelled, so the
// planner itself never depends on gRPC). The loops poll Stopped() once per
// trajectory step, simulation and probe (and every 1,024 activations while
// a MutwoPolicy builds its round state); once it returned true it stays
// true, and the planner ends with what it has, which PlanSchedule turns into
// status().
//
// Thread safety: polled by the one thread that plans; the cancellation
// callback may read state of other threads (it must be thread-safe).
#ifndef MUTWO_PLANNER_INTERRUPT_H_
#define MUTWO_PLANNER_INTERRUPT_H_

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mutwo::planner {

class Interrupt {
 public:
  // Never stops.
  Interrupt() = default;
  Interrupt(absl::Time deadline, std::function<bool()> cancelled)
      : deadline_(deadline),
        start_(absl::Now()),
        cancelled_(std::move(cancelled)) {}

  bool Stopped() {
    if (why_ != Why::kRunning) return true;
    if (cancelled_ && cancelled_()) {
      why_ = Why::kCancelled;
    } else if (deadline_ != absl::InfiniteFuture() &&
               absl::Now() >= deadline_) {
      why_ = Why::kDeadline;
    }
    return why_ != Why::kRunning;
  }
  // OK while running; Cancelled or DeadlineExceeded (naming the time
  // allowed) once stopped.
  absl::Status status() const {
    switch (why_) {
      case Why::kRunning:
        return absl::OkStatus();
      case Why::kCancelled:
        return absl::CancelledError(
            "planning stopped: the caller cancelled the request");
      case Why::kDeadline:
        return absl::DeadlineExceededError(absl::StrCat(
            "planning stopped after ",
            absl::ToInt64Milliseconds(deadline_ - start_),
            " ms, the time allowed per schedule (mutwo-server "
            "--max_plan_ms); the profile's recompute lineages are too "
            "dense to plan in that time"));
    }
    return absl::OkStatus();
  }

 private:
  enum class Why { kRunning, kCancelled, kDeadline };
  absl::Time deadline_ = absl::InfiniteFuture();
  absl::Time start_ = absl::Now();
  std::function<bool()> cancelled_;
  Why why_ = Why::kRunning;
};

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_INTERRUPT_H_
