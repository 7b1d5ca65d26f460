// Load client for cached GetSchedule over loopback (the service's latency and
// throughput goal: p99 <= 2 ms at >= 5,000 RPS).
// Starts mutwo-server in this process on an ephemeral port with a temporary
// data dir, prepares one job whose profile is reported through WorkerHub (a
// synthetic chain of --nodes nodes, as a worker would report it), warms the
// schedule cache, then runs --threads client threads, each with its own
// channel, issuing GetSchedule back to back for --seconds. Prints one JSON
// object: requests, rps, p50/p90/p99/max latency in ms, errors.
//
//   build/bin/schedule_rpc_bench --threads=4 --seconds=10 --nodes=500
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/args.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "grpcpp/grpcpp.h"
#include "mutwo/v1/planner.grpc.pb.h"
#include "mutwo/v1/worker_hub.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/model_archive.h"
#include "tests/testing/synthetic_profile.h"

ABSL_FLAG(int32_t, threads, 4, "client threads (one channel each)");
ABSL_FLAG(double, seconds, 10, "measured duration");
ABSL_FLAG(int32_t, nodes, 500, "nodes of the synthetic profile");
ABSL_FLAG(bool, include_pareto, false, "request the Pareto curve too");

namespace mutwo {
namespace {

int Run() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       absl::StrFormat("mutwo_rpc_bench_%d", getpid());
  fs::remove_all(dir);
  MutwoServer::Options options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.data_dir = dir.string();
  options.plan = PlannerPlanFn(20);
  options.max_batch = PlannerMaxBatchFn();
  auto server = *MutwoServer::Create(options);
  if (auto s = server->Start(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  const std::string address = absl::StrFormat("127.0.0.1:%d", server->port());
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto planner_stub = v1::Planner::NewStub(channel);
  auto hub = v1::WorkerHub::NewStub(channel);

  // Upload a model, submit a job, and report its profile as a worker would.
  // A model archive the check at submit accepts (no worker loads it here).
  const std::string model = testing::UncheckedModelArchive("bench model bytes");
  {
    grpc::ClientContext ctx;
    v1::UploadModelResponse resp;
    auto writer = planner_stub->UploadModel(&ctx, &resp);
    v1::UploadModelRequest h, c;
    h.mutable_header()->set_size_bytes(model.size());
    h.mutable_header()->set_sha256(Sha256Hex(model));
    c.set_chunk(model);
    writer->Write(h);
    writer->Write(c);
    writer->WritesDone();
    if (auto s = writer->Finish(); !s.ok()) {
      std::cerr << "upload: " << s.error_message() << "\n";
      return 1;
    }
  }
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_model_sha256(Sha256Hex(model));
  submit.mutable_spec()->set_model_name("bench");
  *submit.mutable_spec()->add_inputs() = *ParseTensorSpec("x:float32[B,64]");
  submit.mutable_spec()->add_batch_sizes(8);
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    if (auto s = planner_stub->SubmitJob(&ctx, submit, &submitted); !s.ok()) {
      std::cerr << "submit: " << s.error_message() << "\n";
      return 1;
    }
  }
  v1::RegisterWorkerRequest reg;
  reg.mutable_worker()->mutable_device()->set_kind("cpu");
  v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext ctx;
    (void)hub->RegisterWorker(&ctx, reg, &registered);
  }
  v1::LeaseTaskRequest lease_req;
  lease_req.set_worker_id(registered.worker_id());
  lease_req.set_wait_ms(1000);
  v1::LeaseTaskResponse lease;
  {
    grpc::ClientContext ctx;
    if (auto s = hub->LeaseTask(&ctx, lease_req, &lease);
        !s.ok() || !lease.has_task()) {
      std::cerr << "lease failed\n";
      return 1;
    }
  }
  v1::ReportProfileRequest report;
  report.set_worker_id(registered.worker_id());
  report.set_task_id(lease.task().task_id());
  report.set_fence_token(lease.task().fence_token());
  *report.mutable_profile() =
      testing::ChainProfile(8, absl::GetFlag(FLAGS_nodes), 256 << 10);
  {
    grpc::ClientContext ctx;
    v1::ReportResponse r;
    if (auto s = hub->ReportProfile(&ctx, report, &r); !s.ok()) {
      std::cerr << "report: " << s.error_message() << "\n";
      return 1;
    }
  }
  v1::GetScheduleRequest request;
  request.set_job_id(submitted.job().job_id());
  request.set_batch_size(8);
  *request.mutable_budget() = *ParseBudget("60%");
  request.set_include_pareto(absl::GetFlag(FLAGS_include_pareto));
  {
    grpc::ClientContext ctx;  // warms the cache
    v1::Schedule s;
    if (auto st = planner_stub->GetSchedule(&ctx, request, &s); !st.ok()) {
      std::cerr << "warm-up: " << st.error_message() << "\n";
      return 1;
    }
  }

  const int threads = absl::GetFlag(FLAGS_threads);
  const auto duration =
      std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds));
  std::vector<std::vector<double>> latencies(threads);
  std::atomic<int64_t> errors{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      grpc::ChannelArguments args;
      args.SetInt("mutwo.bench.channel", t);  // distinct channels
      auto stub = v1::Planner::NewStub(grpc::CreateCustomChannel(
          address, grpc::InsecureChannelCredentials(), args));
      v1::Schedule schedule;
      while (std::chrono::steady_clock::now() - start < duration) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
        const auto t0 = std::chrono::steady_clock::now();
        grpc::Status s = stub->GetSchedule(&ctx, request, &schedule);
        const auto t1 = std::chrono::steady_clock::now();
        if (!s.ok()) {
          ++errors;
          continue;
        }
        latencies[t].push_back(
            std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    });
  }
  for (auto& th : pool) th.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double q) {
    return all.empty() ? 0.0
                       : all[std::min(all.size() - 1, size_t(q * all.size()))];
  };
  std::cout << absl::StrFormat(
      "{\"benchmark\": \"cached_get_schedule\", \"threads\": %d, \"nodes\": "
      "%d, "
      "\"include_pareto\": %s, \"seconds\": %.2f, \"requests\": %d, "
      "\"errors\": %d, "
      "\"rps\": %.0f, \"p50_ms\": %.3f, \"p90_ms\": %.3f, \"p99_ms\": %.3f, "
      "\"max_ms\": %.3f, \"cpus\": %d}\n",
      threads, absl::GetFlag(FLAGS_nodes),
      absl::GetFlag(FLAGS_include_pareto) ? "true" : "false", elapsed,
      all.size(), errors.load(), all.size() / elapsed, pct(0.5), pct(0.9),
      pct(0.99), all.empty() ? 0.0 : all.back(),
      static_cast<int>(std::thread::hardware_concurrency()));
  server->Shutdown(absl::Seconds(2));
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace mutwo

int main(int argc, char** argv) {
  auto args = mutwo::ParseArgs(argc, argv, 1, {});
  if (!args.ok()) {
    std::cerr << args.status().message() << "\n";
    return 2;
  }
  if (args->help) {
    std::cout << mutwo::UsageWithFlags(
        "schedule_rpc_bench: cached GetSchedule load over loopback.\n\n"
        "Usage: schedule_rpc_bench [--threads=4] [--seconds=10] [--nodes=500]");
    return 0;
  }
  (void)mutwo::InitLogging("bench", "warn");
  return mutwo::Run();
}
