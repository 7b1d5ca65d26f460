// mutwo-server: parses flags, starts the server, waits for SIGTERM/SIGINT on
// the main thread with sigwait (signals are blocked everywhere else), then
// drains and exits 0.
#include <csignal>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/args.h"
#include "common/logging.h"
#include "common/parse.h"
#include "common/status_macros.h"
#include "server/profile_trust.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics listen address; empty: off");
ABSL_FLAG(std::string, data_dir, "./mutwo-data",
          "directory for the SQLite database and model files");
ABSL_FLAG(int32_t, lease_timeout_ms, 30000,
          "a leased task whose worker sends no heartbeat for this long is "
          "re-queued");
ABSL_FLAG(int32_t, max_attempts, 3,
          "attempts per task before it fails with its last reason");
ABSL_FLAG(std::string, max_model_bytes, "512MiB",
          "largest accepted model upload, e.g. 512MiB");
ABSL_FLAG(int32_t, max_concurrent_jobs, 0,
          "refuse new jobs while this many are unfinished; 0: no limit");
ABSL_FLAG(int32_t, pareto_points, 20,
          "budgets in each schedule's Pareto sweep");
ABSL_FLAG(int32_t, validation_rounds, 3,
          "validation rounds per batch size and budget: a schedule measured "
          "over its budget is re-planned below it by the overshoot and "
          "validated again, at most this many rounds in all");
ABSL_FLAG(int32_t, max_uploads_per_client, 2,
          "uploads one principal may run at once; more are refused with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, max_upload_bytes_per_client, "",
          "declared bytes of one principal's running uploads together, e.g. "
          "1GiB; empty: twice --max_model_bytes");
ABSL_FLAG(int64_t, max_plan_ms, 10000,
          "time allowed to plan one schedule (with its Pareto curve); past "
          "it the request fails with DEADLINE_EXCEEDED");
ABSL_FLAG(double, replan_margin, 0.01,
          "re-planning after an overshoot: margin added to the measured "
          "overshoot, as a fraction of the budget");
ABSL_FLAG(int32_t, max_lease_waiters, 1000,
          "LeaseTask long polls waiting at once; more are refused with "
          "RESOURCE_EXHAUSTED and a retry hint; a poll holds no thread");
ABSL_FLAG(int32_t, max_watchers, 1000,
          "WatchJob streams open at once; more are refused with "
          "RESOURCE_EXHAUSTED and a retry hint; a watch holds no thread");
ABSL_FLAG(int32_t, max_profile_nodes, 8192,
          "largest profile a worker may report, in IR nodes (and backward "
          "steps); larger ones are refused with RESOURCE_EXHAUSTED before "
          "anything is stored or planned");
ABSL_FLAG(int64_t, max_profile_edges, 65536,
          "largest profile a worker may report, in edges (IR data edges "
          "plus recompute lineages); larger ones are refused the same way");
ABSL_FLAG(int64_t, max_report_plan_ms, 30000,
          "time allowed to plan one profile report as a whole (the knee and "
          "every budget of its job); past it the remaining plans are cut and "
          "the batch size's result says so");
ABSL_FLAG(std::string, max_report_plan_bytes, "256MiB",
          "memory one profile report's planning may hold (the planner's "
          "working set, estimated at 192 B per node, backward step, "
          "activation and edge, plus the schedules kept until the report is "
          "stored): a profile that needs more for one plan is refused, a "
          "report whose schedules would pass it is cut");
ABSL_FLAG(std::string, max_job_result_bytes, "4MiB",
          "serialized size of a job's results, every batch size together "
          "(what GetJob answers): a report whose schedules would pass it is "
          "cut and its result says so");
ABSL_FLAG(int32_t, planning_threads, 2,
          "threads that plan profile reports, off the RPC threads");
ABSL_FLAG(int32_t, max_queued_reports, 8,
          "profile reports waiting for a planning thread; more are refused "
          "with RESOURCE_EXHAUSTED and a retry hint the worker waits "
          "before it reports again");
ABSL_FLAG(std::string, trusted_worker_principals, "",
          "comma-separated worker principals (token names) whose profiles "
          "are trusted without a second measurement: schedules planned from "
          "them are served to jobs of every tenant whose own profile agrees "
          "(docs/service.md, \"Cache entries are bound to what produced "
          "them\")");
ABSL_FLAG(std::string, worker_trust_domains, "",
          "comma-separated PRINCIPAL=DOMAIN: the organisation or pool that "
          "holds each worker token; a profile is confirmed for sharing "
          "across tenants only by an agreeing profile from a worker of "
          "another declared domain (or a trusted principal); principals of "
          "no declared domain confirm nothing");
ABSL_FLAG(double, profile_agreement_tolerance, 0.05,
          "two profiles of one model, spec, batch size and device agree when "
          "their measured peaks differ by at most this fraction of the "
          "larger; a profile that disagrees is flagged and its key's "
          "schedules are no longer shared across tenants");
ABSL_FLAG(std::string, max_stored_model_bytes_per_client, "4GiB",
          "bytes of models one principal may keep in the model store (each "
          "model it uploaded, once); past it uploads are refused with "
          "RESOURCE_EXHAUSTED; admins are not limited; \"unlimited\": no "
          "quota");
ABSL_FLAG(std::string, model_quota_overrides, "",
          "per-principal quotas over --max_stored_model_bytes_per_client "
          "and the admins' exemption, e.g. \"alice=20GiB,ci=unlimited\"");
ABSL_FLAG(int64_t, upload_idle_timeout_ms, 30000,
          "an upload that receives nothing for this long is cancelled, "
          "its temp file removed and its place and bytes freed");
ABSL_FLAG(int32_t, worker_quarantine_failures, 10,
          "a worker id whose tasks fail or whose reports are refused this "
          "many times within --worker_quarantine_window_ms is leased nothing "
          "for --worker_quarantine_ms; 0: never");
ABSL_FLAG(int64_t, worker_quarantine_window_ms, 10 * 60 * 1000,
          "the window of --worker_quarantine_failures");
ABSL_FLAG(int64_t, worker_quarantine_ms, 60 * 60 * 1000,
          "how long a quarantined worker is leased nothing");
ABSL_FLAG(int32_t, max_watchers_per_client, 250,
          "WatchJob streams one principal may hold open at once, so one "
          "client cannot take every other client's place under "
          "--max_watchers; more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_lease_waiters_per_worker, 250,
          "LeaseTask polls one worker principal (token) may hold open at "
          "once, all its worker ids together; more are refused with "
          "RESOURCE_EXHAUSTED. Workers that share one token share this");
ABSL_FLAG(int32_t, waiter_retry_after_ms, 1000,
          "the retry hint of a refused poll or watch, in ms, in its message "
          "and in grpc-retry-pushback-ms");
ABSL_FLAG(int32_t, max_rpc_threads, 0,
          "threads serving the other RPCs; 0: gRPC's default");
ABSL_FLAG(int32_t, drain_timeout_ms, 10000,
          "on SIGTERM, how long in-flight RPCs may take before cancellation");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error or off");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "bearer tokens, one \"ROLE PRINCIPAL sha256:HEX\" per line (roles: "
          "client, worker, admin); empty: no authentication, every caller is "
          "admin (loopback --listen only, unless --insecure)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the gRPC port (TLS); with --tls_key");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA of client certificates (mTLS): a worker principal must "
          "connect with a certificate from it whose common name is its "
          "principal name");
ABSL_FLAG(bool, insecure, false,
          "allow serving a non-loopback --listen without --auth_tokens_file "
          "(anyone reaching the port is admin)");

namespace {
constexpr char kUsage[] =
    "mutwo-server: the mutwo planning service (gRPC).\n\n"
    "Usage: mutwo-server [--listen=HOST:PORT] [--metrics_listen=HOST:PORT]\n"
    "                    [--data_dir=DIR] [flags]";

// A size flag ("512MiB") in bytes; `word` stands for `word_bytes` instead.
// InvalidArgument naming the flag.
absl::StatusOr<int64_t> BytesFlag(const char* flag, const std::string& text,
                                  const char* word = nullptr,
                                  int64_t word_bytes = 0) {
  if (word != nullptr && text == word) return word_bytes;
  auto bytes = mutwo::ParseBytes(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", bytes.status().message()));
  }
  return *bytes;
}

// The server's options from the flags; InvalidArgument naming the flag.
absl::StatusOr<mutwo::MutwoServer::Options> OptionsFromFlags() {
  mutwo::MutwoServer::Options options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.security.tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.security.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.security.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.security.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.security.insecure = absl::GetFlag(FLAGS_insecure);

  mutwo::JobCore::Options& core = options.core;
  core.lease_timeout_ms = absl::GetFlag(FLAGS_lease_timeout_ms);
  core.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  MUTWO_ASSIGN_OR_RETURN(
      core.max_model_bytes,
      BytesFlag("max_model_bytes", absl::GetFlag(FLAGS_max_model_bytes)));
  core.max_concurrent_jobs = absl::GetFlag(FLAGS_max_concurrent_jobs);
  core.max_validation_rounds = absl::GetFlag(FLAGS_validation_rounds);
  core.replan_margin_fraction = absl::GetFlag(FLAGS_replan_margin);
  core.max_plan_ms = absl::GetFlag(FLAGS_max_plan_ms);
  core.max_lease_waiters = absl::GetFlag(FLAGS_max_lease_waiters);
  core.max_watchers = absl::GetFlag(FLAGS_max_watchers);
  core.waiter_retry_after_ms = absl::GetFlag(FLAGS_waiter_retry_after_ms);
  core.profile_limits.max_nodes = absl::GetFlag(FLAGS_max_profile_nodes);
  core.profile_limits.max_edges = absl::GetFlag(FLAGS_max_profile_edges);
  core.max_report_plan_ms = absl::GetFlag(FLAGS_max_report_plan_ms);
  MUTWO_ASSIGN_OR_RETURN(core.profile_limits.max_report_plan_bytes,
                         BytesFlag("max_report_plan_bytes",
                                   absl::GetFlag(FLAGS_max_report_plan_bytes)));
  MUTWO_ASSIGN_OR_RETURN(core.max_job_result_bytes,
                         BytesFlag("max_job_result_bytes",
                                   absl::GetFlag(FLAGS_max_job_result_bytes)));
  options.planning_threads = absl::GetFlag(FLAGS_planning_threads);
  options.max_queued_reports = absl::GetFlag(FLAGS_max_queued_reports);
  core.profile_trust.agreement_tolerance =
      absl::GetFlag(FLAGS_profile_agreement_tolerance);
  for (absl::string_view principal :
       absl::StrSplit(absl::GetFlag(FLAGS_trusted_worker_principals), ',',
                      absl::SkipWhitespace())) {
    core.profile_trust.trusted_worker_principals.emplace_back(
        absl::StripAsciiWhitespace(principal));
  }
  MUTWO_ASSIGN_OR_RETURN(core.profile_trust.worker_trust_domains,
                         mutwo::ParseWorkerTrustDomains(
                             absl::GetFlag(FLAGS_worker_trust_domains)));
  core.max_uploads_per_client = absl::GetFlag(FLAGS_max_uploads_per_client);
  // Empty: twice --max_model_bytes (JobCore::Options).
  MUTWO_ASSIGN_OR_RETURN(
      core.max_upload_bytes_per_client,
      BytesFlag("max_upload_bytes_per_client",
                absl::GetFlag(FLAGS_max_upload_bytes_per_client), "", 0));

  options.max_rpc_threads = absl::GetFlag(FLAGS_max_rpc_threads);
  MUTWO_ASSIGN_OR_RETURN(
      options.max_stored_model_bytes_per_client,
      BytesFlag("max_stored_model_bytes_per_client",
                absl::GetFlag(FLAGS_max_stored_model_bytes_per_client),
                "unlimited", mutwo::UploadQuota::kUnlimited));
  MUTWO_ASSIGN_OR_RETURN(options.model_quota_overrides,
                         mutwo::UploadQuota::ParseOverrides(
                             absl::GetFlag(FLAGS_model_quota_overrides)));
  options.upload_idle_timeout_ms = absl::GetFlag(FLAGS_upload_idle_timeout_ms);
  options.worker_quarantine_failures =
      absl::GetFlag(FLAGS_worker_quarantine_failures);
  options.worker_quarantine_window_ms =
      absl::GetFlag(FLAGS_worker_quarantine_window_ms);
  options.worker_quarantine_ms = absl::GetFlag(FLAGS_worker_quarantine_ms);
  options.max_watchers_per_client =
      absl::GetFlag(FLAGS_max_watchers_per_client);
  options.max_lease_waiters_per_worker =
      absl::GetFlag(FLAGS_max_lease_waiters_per_worker);
  options.plan = mutwo::PlannerPlanFn(absl::GetFlag(FLAGS_pareto_points));
  options.max_batch = mutwo::PlannerMaxBatchFn();
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  auto args = mutwo::ParseArgs(argc, argv, 1, {});
  if (!args.ok()) {
    std::cerr << "mutwo-server: " << args.status().message() << "\n";
    return mutwo::kExitBadInput;
  }
  if (args->help) {
    std::cout << mutwo::UsageWithFlags(kUsage);
    return mutwo::kExitOk;
  }
  if (args->version) {
    std::cout << mutwo::VersionLine("mutwo-server") << "\n";
    return mutwo::kExitOk;
  }
  if (!args->positional.empty()) {
    std::cerr << "mutwo-server: unexpected argument \"" << args->positional[0]
              << "\"; see --help\n";
    return mutwo::kExitBadInput;
  }
  if (auto s =
          mutwo::InitLogging("mutwo-server", absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    std::cerr << "mutwo-server: " << s.message() << "\n";
    return mutwo::kExitBadInput;
  }
  auto options = OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "mutwo-server: " << options.status().message() << "\n";
    return mutwo::kExitBadInput;
  }
  // Block the signals before any thread starts so only sigwait sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = mutwo::MutwoServer::Create(*std::move(options));
  if (!server.ok()) {
    MUTWO_LOG(error, "{}", server.status().ToString());
    return mutwo::kExitBadInput;
  }
  if (auto s = (*server)->Start(); !s.ok()) {
    MUTWO_LOG(error, "{}", s.ToString());
    // A --listen or --metrics_listen that cannot be bound (the port is
    // taken, the address is not this host's) is bad input, like a malformed
    // flag.
    return s.code() == absl::StatusCode::kAlreadyExists ||
                   s.code() == absl::StatusCode::kInvalidArgument
               ? mutwo::kExitBadInput
               : mutwo::kExitFailure;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  MUTWO_LOG(info, "signal {}: draining", sig);
  (*server)->Shutdown(
      absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)));
  MUTWO_LOG(info, "stopped");
  return mutwo::kExitOk;
}
