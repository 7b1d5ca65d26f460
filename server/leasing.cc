#include "server/leasing.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace mutwo {
namespace {

absl::Status RefuseStopped(const v1::WorkerInfo& w) {
  return absl::FailedPreconditionError(
      absl::StrCat("worker \"", w.worker_id(),
                   "\" deregistered (it said it stops); register again to "
                   "lease"));
}

absl::Status Abandoned() {
  return absl::CancelledError("the lease poll was abandoned");
}

}  // namespace

bool LeasePoll::OnWake(WaiterSet::Why why) {
  // `done_` is moved out before it runs: whoever waits on it may destroy
  // this poll as soon as it is called.
  auto finish = [this](absl::StatusOr<v1::LeaseTaskResponse> result) {
    Done done = std::move(done_);
    done(std::move(result));
    return true;
  };
  switch (why) {
    case WaiterSet::Why::kCancelled:
      return finish(Abandoned());
    case WaiterSet::Why::kShutdown:
      return finish(v1::LeaseTaskResponse());
    case WaiterSet::Why::kDeadline:
      // A poll with wait_ms 0 still gets its one look.
      if (!first_) return finish(v1::LeaseTaskResponse());
      break;
    case WaiterSet::Why::kChanged:
      break;
  }
  if (cancelled_ && cancelled_()) return finish(Abandoned());
  auto leased = leasing_->TryLease(*this);
  if (!leased.ok()) return finish(leased.status());
  if (leased->has_value()) return finish(**std::move(leased));
  if (why == WaiterSet::Why::kDeadline) {
    return finish(v1::LeaseTaskResponse());
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Leasing>> Leasing::Create(Options options,
                                                         storage::Store* store,
                                                         Hooks hooks) {
  if (store == nullptr || !hooks.settle || !hooks.refresh_gauges ||
      !hooks.notify_change) {
    return absl::InvalidArgumentError("Leasing needs a store and its hooks");
  }
  WaiterSet::Options poll_options;
  poll_options.what = "lease polls";
  poll_options.flag = "--max_lease_waiters";
  poll_options.max_waiters = options.max_lease_waiters;
  poll_options.retry_after_ms = options.waiter_retry_after_ms;
  poll_options.observe_waiting = hooks.observe_waiting_polls;
  poll_options.observe_refused = hooks.observe_refused_poll;
  MUTWO_ASSIGN_OR_RETURN(std::unique_ptr<WaiterSet> polls,
                         WaiterSet::Create(poll_options));
  return std::unique_ptr<Leasing>(
      new Leasing(options, store, std::move(hooks), std::move(polls)));
}

Leasing::Leasing(Options options, storage::Store* store, Hooks hooks,
                 std::unique_ptr<WaiterSet> polls)
    : options_(options),
      store_(store),
      hooks_(std::move(hooks)),
      polls_(std::move(polls)) {}

Leasing::~Leasing() { Shutdown(); }

void Leasing::Start() {
  reaper_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        const absl::Time deadline =
            absl::Now() + absl::Milliseconds(options_.reaper_interval_ms);
        while (!stopping_ && absl::Now() < deadline) {
          stop_.WaitWithDeadline(&mu_, deadline);
        }
        if (stopping_) return;
      }
      Reap();
    }
  });
}

void Leasing::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_.SignalAll();
  }
  polls_->Shutdown();
  if (reaper_.joinable()) reaper_.join();
}

void Leasing::Notify() { polls_->Notify(); }

int Leasing::waiting_polls() { return polls_->size(); }

absl::StatusOr<uint64_t> Leasing::StartPoll(LeasePoll* poll) {
  const v1::LeaseTaskRequest& request = poll->request_;
  // One row, not every worker: leasing stays flat however many registered.
  MUTWO_ASSIGN_OR_RETURN(v1::WorkerInfo worker,
                         store_->GetWorker(request.worker_id()));
  if (worker.state() == v1::WorkerInfo::STOPPED) return RefuseStopped(worker);
  if (lease_check_) MUTWO_RETURN_IF_ERROR(lease_check_(request.worker_id()));
  poll->device_kind_ = worker.device().kind();
  MUTWO_RETURN_IF_ERROR(
      store_->TouchWorker(request.worker_id(), v1::WorkerInfo::IDLE, ""));
  const int64_t wait_ms =
      std::clamp<int64_t>(request.wait_ms(), 0, options_.max_lease_wait_ms);
  return polls_->Add(poll, absl::Now() + absl::Milliseconds(wait_ms));
}

void Leasing::CancelPoll(uint64_t id) {
  polls_->Wake(id, WaiterSet::Why::kCancelled);
}

absl::StatusOr<v1::LeaseTaskResponse> Leasing::LeaseTask(
    const v1::LeaseTaskRequest& request, std::function<bool()> cancelled) {
  absl::Notification answered;
  absl::StatusOr<v1::LeaseTaskResponse> result;
  LeasePoll poll(this, request, cancelled,
                 [&](absl::StatusOr<v1::LeaseTaskResponse> r) {
                   result = std::move(r);
                   answered.Notify();
                 });
  MUTWO_ASSIGN_OR_RETURN(uint64_t id, StartPoll(&poll));
  while (!answered.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
    if (cancelled && cancelled()) CancelPoll(id);
  }
  return result;
}

absl::StatusOr<std::optional<v1::LeaseTaskResponse>> Leasing::TryLease(
    LeasePoll& poll) {
  const v1::LeaseTaskRequest& request = poll.request_;
  if (!poll.first_) {
    // A worker that deregistered meanwhile is leased nothing more.
    MUTWO_ASSIGN_OR_RETURN(v1::WorkerInfo worker,
                           store_->GetWorker(request.worker_id()));
    if (worker.state() == v1::WorkerInfo::STOPPED) {
      return RefuseStopped(worker);
    }
  }
  poll.first_ = false;
  // A worker quarantined while its poll waited leases nothing either.
  if (lease_check_) MUTWO_RETURN_IF_ERROR(lease_check_(request.worker_id()));
  MUTWO_ASSIGN_OR_RETURN(
      std::optional<v1::Task> task,
      store_->LeaseTask(request.worker_id(), poll.device_kind_,
                        options_.lease_timeout_ms));
  if (!task.has_value()) return std::nullopt;
  if (poll.cancelled_ && poll.cancelled_()) {
    // Nobody will receive this lease: give it back now instead of
    // letting the task wait out the lease timeout.
    MUTWO_RETURN_IF_ERROR(store_->ReleaseLease(
        task->task_id(), task->fence_token(), request.worker_id()));
    hooks_.notify_change();
    return Abandoned();
  }
  MUTWO_ASSIGN_OR_RETURN(v1::Job job, store_->GetJob(task->job_id()));
  MUTWO_RETURN_IF_ERROR(store_->TouchWorker(
      request.worker_id(), v1::WorkerInfo::BUSY, task->task_id()));
  MUTWO_LOG(info, "task {} ({} batch {}) leased to {} (attempt {}, fence {})",
            task->task_id(), v1::Task::Kind_Name(task->kind()),
            task->batch_size(), request.worker_id(), task->attempt(),
            task->fence_token());
  v1::LeaseTaskResponse response;
  *response.mutable_task() = *std::move(task);
  *response.mutable_spec() = job.spec();
  response.set_lease_timeout_ms(options_.lease_timeout_ms);
  MUTWO_RETURN_IF_ERROR(hooks_.settle(job.job_id(), /*refresh_gauges=*/false));
  hooks_.notify_change();
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> Leasing::Heartbeat(
    const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  if (request.stopping()) {
    // The worker deregisters: no task is leased to it any more (its running
    // task, if any, it fails itself as it stops).
    MUTWO_RETURN_IF_ERROR(
        store_->TouchWorker(request.worker_id(), v1::WorkerInfo::STOPPED, ""));
    MUTWO_LOG(info, "worker {} stopped (deregistered)", request.worker_id());
    hooks_.refresh_gauges();
    hooks_.notify_change();
    response.set_lease_valid(false);
    return response;
  }
  if (request.task_id().empty()) {
    MUTWO_RETURN_IF_ERROR(
        store_->TouchWorker(request.worker_id(), v1::WorkerInfo::IDLE, ""));
    response.set_lease_valid(true);
    return response;
  }
  MUTWO_RETURN_IF_ERROR(store_->TouchWorker(
      request.worker_id(), v1::WorkerInfo::BUSY, request.task_id()));
  auto task =
      store_->ExtendLease(request.task_id(), request.fence_token(),
                          request.worker_id(), options_.lease_timeout_ms);
  if (absl::IsFailedPrecondition(task.status())) {
    response.set_lease_valid(false);
    auto current = store_->GetTask(request.task_id());
    response.set_cancelled(current.ok() &&
                           current->state() == v1::Task::CANCELLED);
    return response;
  }
  MUTWO_RETURN_IF_ERROR(task.status());
  response.set_lease_valid(true);
  response.set_lease_expiry_unix_ms(task->lease_expiry_unix_ms());
  return response;
}

void Leasing::Reap() {
  bool changed = false;
  auto requeued = store_->RequeueExpiredLeases(options_.max_attempts);
  if (requeued.ok()) {
    for (const v1::Task& t : *requeued) {
      MUTWO_LOG(warn, "task {} of job {}: lease expired -> {} (attempt {})",
                t.task_id(), t.job_id(), v1::Task::State_Name(t.state()),
                t.attempt());
      (void)hooks_.settle(t.job_id(), /*refresh_gauges=*/true);
      changed = true;
    }
  } else {
    MUTWO_LOG(error, "requeue expired leases: {}",
              requeued.status().ToString());
  }
  auto lost = store_->MarkLostWorkers(options_.worker_lost_after_ms);
  if (lost.ok() && !lost->empty()) changed = true;
  auto forgotten =
      store_->DeleteForgottenWorkers(options_.worker_forget_after_ms);
  if (forgotten.ok() && *forgotten > 0) {
    MUTWO_LOG(info, "forgot {} workers silent for over {} ms", *forgotten,
              options_.worker_forget_after_ms);
  } else if (!forgotten.ok()) {
    MUTWO_LOG(error, "forget workers: {}", forgotten.status().ToString());
  }
  hooks_.refresh_gauges();
  if (changed) hooks_.notify_change();
}

}  // namespace mutwo
