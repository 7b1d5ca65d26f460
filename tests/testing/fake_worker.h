// A worker without LibTorch for service tests against the real server: it
// registers over WorkerHub, leases tasks and reports a synthetic chain
// profile (tests/testing/synthetic_profile.h) for PROFILE tasks and a
// validation that fits, at the predicted peak, for VALIDATE tasks; one task
// in `fail_one_in` (0: none) is failed instead (retryable).
#ifndef MUTWO_TESTS_TESTING_FAKE_WORKER_H_
#define MUTWO_TESTS_TESTING_FAKE_WORKER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "tests/testing/synthetic_profile.h"

namespace mutwo::testing {

// Leases and reports until `stop` is set; survives the server going away
// (registers again when the server forgot the worker). `step_time_scale`
// scales the measured step time of the profiles it reports (another
// machine, or timing noise between two profiles of one model).
inline void RunFakeWorker(const std::shared_ptr<grpc::Channel>& channel,
                          const std::atomic<bool>& stop, uint64_t seed,
                          int fail_one_in, double step_time_scale = 1.0) {
  auto in = [](int ms) {
    return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
  };
  std::mt19937_64 rng(seed);
  auto hub = v1::WorkerHub::NewStub(channel);
  std::string worker_id;
  while (!stop) {
    if (worker_id.empty()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(in(1000));
      v1::RegisterWorkerRequest reg;
      reg.mutable_worker()->mutable_device()->set_kind("cpu");
      v1::RegisterWorkerResponse registered;
      if (!hub->RegisterWorker(&ctx, reg, &registered).ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      worker_id = registered.worker_id();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(in(1000));
    v1::LeaseTaskRequest lease;
    lease.set_worker_id(worker_id);
    lease.set_wait_ms(300);
    v1::LeaseTaskResponse leased;
    const grpc::Status s = hub->LeaseTask(&ctx, lease, &leased);
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) worker_id.clear();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (!leased.has_task()) continue;
    const v1::Task& task = leased.task();
    grpc::ClientContext report_ctx;
    report_ctx.set_deadline(in(3000));
    v1::ReportResponse ignored;
    if (fail_one_in > 0 && rng() % fail_one_in == 0) {
      v1::FailTaskRequest r;
      r.set_worker_id(worker_id);
      r.set_task_id(task.task_id());
      r.set_fence_token(task.fence_token());
      r.set_reason("injected failure");
      r.set_retryable(true);
      (void)hub->FailTask(&report_ctx, r, &ignored);
    } else if (task.kind() == v1::Task::PROFILE) {
      v1::ReportProfileRequest r;
      r.set_worker_id(worker_id);
      r.set_task_id(task.task_id());
      r.set_fence_token(task.fence_token());
      *r.mutable_profile() = ChainProfile(task.batch_size());
      r.mutable_profile()->mutable_measured()->set_iteration_ms(
          r.profile().measured().iteration_ms() * step_time_scale);
      (void)hub->ReportProfile(&report_ctx, r, &ignored);
    } else {
      v1::ReportValidationRequest r;
      r.set_worker_id(worker_id);
      r.set_task_id(task.task_id());
      r.set_fence_token(task.fence_token());
      auto* v = r.mutable_validation();
      v->set_budget_bytes(task.schedule().budget_bytes());
      v->mutable_scheduled()->set_peak_bytes(
          task.schedule().predicted_peak_bytes());
      v->mutable_predicted()->set_peak_bytes(
          task.schedule().predicted_peak_bytes());
      v->set_within_budget(true);
      v->set_gradients_match(true);
      v->set_batchnorm_stats_match(true);
      (void)hub->ReportValidation(&report_ctx, r, &ignored);
    }
  }
}

}  // namespace mutwo::testing

#endif  // MUTWO_TESTS_TESTING_FAKE_WORKER_H_
