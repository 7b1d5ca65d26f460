#include "client/rpc_commands.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <random>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/rpc.h"
#include "client/svg_chart.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "common/sha256.h"
#include "common/validation_check.h"

ABSL_FLAG(std::string, batch, "",
          "submit: batch sizes (16, 8,16,32, 8:64, 8:64:x2, 8:32:+8); "
          "schedule/profile/plot: one batch size");
ABSL_FLAG(std::string, input, "",
          "model input NAME:DTYPE[DIMS]{LOW,HIGH}, repeated in argument "
          "order, e.g. x:float32[B,3,224,224]");
ABSL_FLAG(std::string, loss, "mean",
          "mean, sum, model or cross_entropy:TARGET");
ABSL_FLAG(std::string, optimizer, "sgd",
          "none, sgd, sgd_momentum, adam, adamw [:lr=...,momentum=...]");
ABSL_FLAG(double, max_overhead, 0.25,
          "largest iteration-time overhead accepted for the max batch size "
          "with a schedule (0.25 = +25%)");
ABSL_FLAG(std::string, device_kind, "", "cpu, cuda or empty (any worker)");
ABSL_FLAG(std::string, name, "",
          "display name of the model (default: file name)");
ABSL_FLAG(std::string, request_id, "",
          "idempotency key: a repeated submit with the same id returns the "
          "first job (default: random)");
ABSL_FLAG(bool, wait, false, "submit: wait for the job, showing progress");
ABSL_FLAG(int32_t, wait_timeout_s, 3600,
          "submit --wait: give up after this long");
ABSL_FLAG(std::string, state, "",
          "jobs: only jobs in this state (e.g. SUCCEEDED)");
ABSL_FLAG(int32_t, limit, 20, "jobs: how many to list");
ABSL_FLAG(std::string, format, "text", "profile: text, csv or json");
ABSL_FLAG(int64_t, max_model_bytes, int64_t{512} << 20,
          "submit: refuse model files larger than this before uploading");

ABSL_FLAG(std::string, kind, "timeline", "plot: timeline or batch");
ABSL_FLAG(std::string, o, "", "plot: the SVG file to write");

ABSL_DECLARE_FLAG(std::string, budget);
ABSL_DECLARE_FLAG(std::string, policy);
ABSL_DECLARE_FLAG(bool, pareto);

namespace mutwo {
namespace {

constexpr int64_t kChunkBytes = 1 << 20;

std::string RandomRequestId() {
  std::random_device rd;
  return absl::StrFormat("req-%016x%016x", (uint64_t{rd()} << 32) | rd(),
                         (uint64_t{rd()} << 32) | rd());
}

int BadInput(const std::string& command, absl::string_view message) {
  std::cerr << "mutwo " << command << ": " << message << "\n";
  return kExitBadInput;
}

absl::StatusOr<int64_t> OneBatch(const std::string& command) {
  int64_t batch = 0;
  if (!absl::SimpleAtoi(absl::GetFlag(FLAGS_batch), &batch) || batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch must be one positive batch size, got \"",
                     absl::GetFlag(FLAGS_batch), "\""));
  }
  return batch;
}

std::string Pct(double ratio) {
  return absl::StrFormat("%+.1f%%", ratio * 100);
}

// The check column for one budget: only FITS says "fits".
std::string CheckText(const v1::BudgetOutcome& o) {
  switch (o.state()) {
    case v1::BudgetOutcome::FITS:
      return o.rounds() > 1 ? absl::StrCat("fits (", o.rounds(), " rounds)")
                            : "fits";
    case v1::BudgetOutcome::VALIDATING:
      return o.rounds() == 0 ? "validating"
                             : absl::StrCat("over, re-validating (round ",
                                            o.rounds() + 1, ")");
    case v1::BudgetOutcome::OVER_BUDGET:
      return "NOT FITTING";
    case v1::BudgetOutcome::INFEASIBLE:
      return "-";
    case v1::BudgetOutcome::FAILED:
      return "FAILED";
    default:
      return "-";
  }
}

void PrintJobText(const v1::Job& job) {
  std::cout << "job " << job.job_id() << "  "
            << v1::Job::State_Name(job.state()) << "  model "
            << job.spec().model_name() << " ("
            << job.spec().model_sha256().substr(0, 12) << ")  tasks "
            << job.tasks_done() << "/" << job.tasks_total() << "\n";
  if (!job.error().empty()) std::cout << "error: " << job.error() << "\n";
  if (!job.waiting().empty()) {
    std::cout << "waiting: " << job.waiting() << "\n";
  }
  if (job.results().empty()) return;
  std::cout << absl::StrFormat(
      "%6s  %-10s  %12s  %10s  %12s  %10s  %8s  %12s  %10s  %s\n", "batch",
      "budget", "base peak", "base ms", "plan peak", "plan ms", "overhead",
      "measured", "meas ms", "check");
  // Why budgets do not fit, printed under the table.
  std::vector<std::string> notes;
  for (const v1::BatchResult& r : job.results()) {
    if (r.oom() || (!r.error().empty() && r.schedules().empty())) {
      std::cout << absl::StrFormat("%6d  %s\n", r.batch_size(),
                                   r.oom() ? "out of memory" : r.error());
      continue;
    }
    for (int i = 0; i < r.schedules_size(); ++i) {
      const v1::Schedule& s = r.schedules(i);
      const std::string budget = s.budget().text().empty()
                                     ? FormatBudget(s.budget())
                                     : s.budget().text();
      const v1::BudgetOutcome* o =
          i < r.outcomes_size() ? &r.outcomes(i) : nullptr;
      // The last round's validation (a job of an older server has no
      // outcomes: its last validation for the budget).
      const v1::Validation* v = nullptr;
      for (const auto& val : r.validations()) {
        if (val.budget_bytes() == s.budget_bytes() &&
            (o == nullptr || val.round() == o->rounds())) {
          v = &val;
        }
      }
      std::string measured = "-", meas_ms = "-", check = "-";
      if (v != nullptr) {
        measured = FormatBytes(v->scheduled().peak_bytes());
        meas_ms = absl::StrFormat("%.1f", v->scheduled().iteration_ms());
      }
      if (o != nullptr) {
        check = CheckText(*o);
        if (!o->reason().empty() &&
            o->state() != v1::BudgetOutcome::INFEASIBLE) {
          notes.push_back(absl::StrCat("batch ", r.batch_size(), ", budget ",
                                       budget, ": ", check, ": ", o->reason()));
        }
      } else if (v != nullptr) {
        const ValidationCheck c = CheckValidation(*v);
        check = c.ok() ? "fits" : "NOT FITTING";
        if (!c.ok()) {
          notes.push_back(absl::StrCat("batch ", r.batch_size(), ", budget ",
                                       budget, ": ", c.problem));
        }
      }
      // A schedule marked infeasible by a measurement still has its plan.
      const bool planned = s.feasible() || s.measured_peak_bytes() > 0;
      const double overhead =
          s.baseline_iteration_ms() > 0
              ? s.predicted_iteration_ms() / s.baseline_iteration_ms() - 1
              : 0;
      std::cout << absl::StrFormat(
          "%6d  %-10s  %12s  %10.1f  %12s  %10.1f  %8s  %12s  %10s  %s\n",
          r.batch_size(), budget, FormatBytes(r.baseline_peak_bytes()),
          r.baseline_iteration_ms(),
          planned ? FormatBytes(s.predicted_peak_bytes())
                  : absl::StrCat("infeasible (floor ",
                                 FormatBytes(s.floor_bytes()), ")"),
          s.predicted_iteration_ms(), planned ? Pct(overhead) : "-", measured,
          meas_ms, check);
    }
  }
  for (const std::string& note : notes) std::cout << note << "\n";
  if (job.has_max_batch()) {
    const auto& m = job.max_batch();
    std::cout << "max batch (capacity " << FormatBytes(m.capacity_bytes())
              << "): " << m.max_batch_without_checkpointing()
              << " without checkpointing, " << m.max_batch_with_schedule()
              << " with a schedule (overhead <= " << Pct(m.max_overhead())
              << ")";
    if (!m.verify_batch_sizes().empty()) {
      std::cout << "; verify " << absl::StrJoin(m.verify_batch_sizes(), ", ");
    }
    std::cout << "\n";
  }
}

bool IsFinal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED ||
         s == v1::Job::CANCELLED;
}

// Streams WatchJob until the job is final; a progress bar on a terminal,
// plain lines otherwise. Returns the final job.
absl::StatusOr<v1::Job> WaitForJob(v1::Planner::Stub& stub,
                                   const std::string& job_id) {
  const bool tty = isatty(STDERR_FILENO);
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::seconds(absl::GetFlag(FLAGS_wait_timeout_s)));
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = stub.WatchJob(&context, request);
  v1::JobEvent event;
  std::optional<v1::Job> final_job;
  while (reader->Read(&event)) {
    if (tty) {
      const int width = 30;
      const int filled = event.tasks_total() > 0
                             ? width * event.tasks_done() / event.tasks_total()
                             : 0;
      std::cerr << "\r[" << std::string(filled, '#')
                << std::string(width - filled, '.') << "] "
                << absl::StrFormat("%-10s %d/%d tasks",
                                   v1::Job::State_Name(event.state()),
                                   event.tasks_done(), event.tasks_total())
                << (event.waiting().empty() ? "" : "  waiting: ")
                << event.waiting() << "\x1b[K" << std::flush;
    } else {
      std::cerr << "job " << job_id << ": " << event.message() << "\n";
    }
    if (event.has_job()) final_job = event.job();
  }
  if (tty) std::cerr << "\n";
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  if (!final_job.has_value()) {
    return absl::UnavailableError("the watch ended before the job finished");
  }
  return *final_job;
}

}  // namespace

int SubmitCommand(const ParsedArgs& args) {
  const std::string cmd = "submit";
  if (args.positional.size() != 1) {
    return BadInput(cmd,
                    "usage: mutwo submit MODEL.pt --input ... --batch ... "
                    "--budget ... [--wait]");
  }
  const std::string path = args.positional[0];
  v1::SubmitJobRequest request;
  v1::JobSpec& spec = *request.mutable_spec();
  for (const std::string& in : args.Repeated("input")) {
    auto t = ParseTensorSpec(in);
    if (!t.ok()) return BadInput(cmd, t.status().message());
    *spec.add_inputs() = *t;
  }
  if (auto s = ValidateInputs({spec.inputs().begin(), spec.inputs().end()});
      !s.ok()) {
    return BadInput(cmd, s.message());
  }
  auto batches = ParseBatchSizes(absl::GetFlag(FLAGS_batch));
  if (absl::GetFlag(FLAGS_batch).empty()) {
    return BadInput(cmd, "--batch is required, like --batch 8:64");
  }
  if (!batches.ok()) return BadInput(cmd, batches.status().message());
  for (int64_t b : *batches) spec.add_batch_sizes(b);
  for (const std::string& b : args.Repeated("budget")) {
    auto budget = ParseBudget(b);
    if (!budget.ok()) return BadInput(cmd, budget.status().message());
    *spec.add_budgets() = *budget;
  }
  auto loss = ParseLossSpec(absl::GetFlag(FLAGS_loss));
  if (!loss.ok()) return BadInput(cmd, loss.status().message());
  *spec.mutable_loss() = *loss;
  auto optimizer = ParseOptimizerSpec(absl::GetFlag(FLAGS_optimizer));
  if (!optimizer.ok()) return BadInput(cmd, optimizer.status().message());
  *spec.mutable_optimizer() = *optimizer;
  spec.set_max_overhead(absl::GetFlag(FLAGS_max_overhead));
  spec.set_device_kind(absl::GetFlag(FLAGS_device_kind));
  auto bytes = ReadFile(path, absl::GetFlag(FLAGS_max_model_bytes));
  if (!bytes.ok()) return BadInput(cmd, bytes.status().message());
  const std::string sha = Sha256Hex(*bytes);
  std::string name = absl::GetFlag(FLAGS_name);
  if (name.empty()) {
    name = path.substr(path.find_last_of('/') + 1);
    if (name.size() > 3 && name.substr(name.size() - 3) == ".pt") {
      name.resize(name.size() - 3);
    }
  }
  spec.set_model_sha256(sha);
  spec.set_model_name(name);
  request.set_client_request_id(absl::GetFlag(FLAGS_request_id).empty()
                                    ? RandomRequestId()
                                    : absl::GetFlag(FLAGS_request_id));

  auto stub = PlannerStub();
  {
    grpc::ClientContext context;
    // Large models take longer than one small RPC.
    SetDeadline(context, 1.0 + static_cast<double>(bytes->size()) / (64 << 20));
    v1::UploadModelResponse response;
    auto writer = stub->UploadModel(&context, &response);
    v1::UploadModelRequest header;
    header.mutable_header()->set_size_bytes(
        static_cast<int64_t>(bytes->size()));
    header.mutable_header()->set_sha256(sha);
    header.mutable_header()->set_name(name);
    bool ok = writer->Write(header);
    for (size_t off = 0; ok && off < bytes->size(); off += kChunkBytes) {
      v1::UploadModelRequest chunk;
      chunk.set_chunk(bytes->substr(off, kChunkBytes));
      ok = writer->Write(chunk);
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    if (!status.ok()) return RpcError(cmd, status);
    std::cerr << "uploaded " << name << " ("
              << FormatBytes(response.size_bytes()) << ", sha256 "
              << sha.substr(0, 12) << ")"
              << (response.already_stored() ? ", already stored" : "") << "\n";
  }
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub->SubmitJob(&context, request, &submitted);
    if (!status.ok()) return RpcError(cmd, status);
  }
  const std::string job_id = submitted.job().job_id();
  std::cerr << "job " << job_id << " submitted"
            << (submitted.deduplicated() ? " (request seen before)" : "")
            << "\n";
  if (!absl::GetFlag(FLAGS_wait)) {
    if (JsonOutput()) {
      std::cout << ProtoToJson(submitted.job());
    } else {
      std::cout << job_id << "\n";
    }
    return kExitOk;
  }
  auto job = WaitForJob(*stub, job_id);
  if (!job.ok()) {
    std::cerr << "mutwo submit: waiting for " << job_id << ": "
              << job.status().message() << "\n";
    return job.status().code() == absl::StatusCode::kUnavailable ||
                   job.status().code() == absl::StatusCode::kDeadlineExceeded
               ? kExitUnavailable
               : kExitFailure;
  }
  if (JsonOutput()) {
    std::cout << ProtoToJson(*job);
  } else {
    PrintJobText(*job);
  }
  return job->state() == v1::Job::SUCCEEDED ? kExitOk : kExitFailure;
}

int JobsCommand(const ParsedArgs&) {
  v1::ListJobsRequest request;
  if (!absl::GetFlag(FLAGS_state).empty()) {
    v1::Job::State state;
    if (!v1::Job::State_Parse(absl::GetFlag(FLAGS_state), &state)) {
      return BadInput("jobs",
                      absl::StrCat("--state \"", absl::GetFlag(FLAGS_state),
                                   "\": use QUEUED, PROFILING, PLANNING, "
                                   "VALIDATING, SUCCEEDED, FAILED or "
                                   "CANCELLED"));
    }
    request.add_states(state);
  }
  request.set_page_size(absl::GetFlag(FLAGS_limit));
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ListJobsResponse response;
  grpc::Status status = PlannerStub()->ListJobs(&context, request, &response);
  if (!status.ok()) return RpcError("jobs", status);
  if (JsonOutput()) {
    std::cout << ProtoToJson(response);
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-28s  %-10s  %-20s  %-7s  %s\n", "JOB",
                               "STATE", "MODEL", "TASKS", "BATCHES");
  for (const v1::Job& j : response.jobs()) {
    std::cout << absl::StrFormat(
        "%-28s  %-10s  %-20s  %3d/%-3d  %s\n", j.job_id(),
        v1::Job::State_Name(j.state()), j.spec().model_name(), j.tasks_done(),
        j.tasks_total(), absl::StrJoin(j.spec().batch_sizes(), ","));
  }
  return kExitOk;
}

int JobCommand(const ParsedArgs& args) {
  if (args.positional.size() != 1)
    return BadInput("job", "usage: mutwo job JOB_ID");
  v1::GetJobRequest request;
  request.set_job_id(args.positional[0]);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::Job job;
  grpc::Status status = PlannerStub()->GetJob(&context, request, &job);
  if (!status.ok()) return RpcError("job", status);
  if (JsonOutput()) {
    std::cout << ProtoToJson(job);
  } else {
    PrintJobText(job);
  }
  return kExitOk;
}

int ScheduleCommand(const ParsedArgs& args) {
  const std::string cmd = "schedule";
  if (args.positional.size() != 1) {
    return BadInput(cmd, "usage: mutwo schedule JOB_ID --batch N [--budget B]");
  }
  auto batch = OneBatch(cmd);
  if (!batch.ok()) return BadInput(cmd, batch.status().message());
  v1::GetScheduleRequest request;
  request.set_job_id(args.positional[0]);
  request.set_batch_size(*batch);
  const auto& budgets = args.Repeated("budget");
  if (budgets.size() > 1) return BadInput(cmd, "give at most one --budget");
  auto budget = ParseBudget(budgets.empty() ? "60%" : budgets[0]);
  if (!budget.ok()) return BadInput(cmd, budget.status().message());
  *request.mutable_budget() = *budget;
  const std::string policy = absl::GetFlag(FLAGS_policy);
  v1::Policy p = v1::MUTWO;
  if (!policy.empty()) {
    std::string upper = policy;
    for (char& c : upper) c = static_cast<char>(std::toupper(c));
    if (!v1::Policy_Parse(upper, &p) || p == v1::POLICY_UNSPECIFIED) {
      return BadInput(cmd,
                      absl::StrCat("--policy \"", policy,
                                   "\": use mutwo, sqrt_n, per_block or none"));
    }
  }
  request.set_policy(p);
  request.set_include_pareto(absl::GetFlag(FLAGS_pareto));
  grpc::ClientContext context;
  SetDeadline(context);
  v1::Schedule schedule;
  grpc::Status status =
      PlannerStub()->GetSchedule(&context, request, &schedule);
  if (!status.ok()) return RpcError(cmd, status);
  if (JsonOutput()) {
    std::cout << ProtoToJson(schedule);
  } else {
    int recompute = 0, swap = 0;
    for (const auto& d : schedule.decisions()) {
      recompute += d.action() == v1::Decision::RECOMPUTE;
      swap += d.action() == v1::Decision::SWAP;
    }
    std::cout << "policy " << v1::Policy_Name(schedule.policy()) << ", budget "
              << FormatBytes(schedule.budget_bytes()) << ": "
              << (schedule.feasible() ? "feasible" : "INFEASIBLE")
              << (schedule.measured_peak_bytes() > 0
                      ? absl::StrCat(
                            ", measured ",
                            FormatBytes(schedule.measured_peak_bytes()))
                      : "")
              << "\n"
              << "  baseline  " << FormatBytes(schedule.baseline_peak_bytes())
              << ", "
              << absl::StrFormat("%.2f ms", schedule.baseline_iteration_ms())
              << "\n  planned   "
              << FormatBytes(schedule.predicted_peak_bytes()) << ", "
              << absl::StrFormat("%.2f ms", schedule.predicted_iteration_ms())
              << "\n  floor     " << FormatBytes(schedule.floor_bytes()) << "\n"
              << (schedule.correction_bytes() > 0
                      ? absl::StrCat("  planned   ",
                                     FormatBytes(schedule.correction_bytes()),
                                     " below the budget (learned from "
                                     "validations)\n")
                      : "")
              << (!schedule.feasible() && !schedule.reason().empty()
                      ? absl::StrCat("  reason    ", schedule.reason(), "\n")
                      : "")
              << "  " << recompute << " recomputed, " << swap << " swapped of "
              << schedule.decisions_size() << " activations\n";
    for (const auto& pt : schedule.pareto()) {
      std::cout << absl::StrFormat("  pareto: peak %s, %.2f ms\n",
                                   FormatBytes(pt.predicted_peak_bytes()),
                                   pt.predicted_iteration_ms());
    }
  }
  return schedule.feasible() ? kExitOk : kExitInfeasible;
}

int ProfileCommand(const ParsedArgs& args) {
  const std::string cmd = "profile";
  if (args.positional.size() != 1) {
    return BadInput(
        cmd, "usage: mutwo profile JOB_ID --batch N [--format csv|json|text]");
  }
  auto batch = OneBatch(cmd);
  if (!batch.ok()) return BadInput(cmd, batch.status().message());
  const std::string format =
      JsonOutput() ? std::string("json") : absl::GetFlag(FLAGS_format);
  if (format != "text" && format != "csv" && format != "json") {
    return BadInput(
        cmd, absl::StrCat("--format \"", format, "\": use text, csv or json"));
  }
  v1::GetProfileRequest request;
  request.set_job_id(args.positional[0]);
  request.set_batch_size(*batch);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::Profile profile;
  grpc::Status status = PlannerStub()->GetProfile(&context, request, &profile);
  if (!status.ok()) return RpcError(cmd, status);
  if (format == "json") {
    std::cout << ProtoToJson(profile);
  } else if (format == "csv") {
    std::cout
        << "value_id,producer_node,kind,scope,size_bytes,last_forward_use,"
           "first_backward_use,last_backward_use,inactive_ms,recompute_ms\n";
    for (const auto& a : profile.activations()) {
      const auto& n = profile.nodes(a.producer_node());
      std::cout << a.value_id() << "," << a.producer_node() << "," << n.kind()
                << "," << n.scope() << "," << a.size_bytes() << ","
                << a.last_forward_use() << "," << a.first_backward_use() << ","
                << a.last_backward_use() << "," << a.inactive_ms() << ","
                << a.recompute_ms() << "\n";
    }
  } else {
    int64_t act = 0;
    for (const auto& a : profile.activations()) act += a.size_bytes();
    std::cout << "batch " << profile.batch_size() << " on "
              << profile.device().name() << ": " << profile.nodes_size()
              << " nodes, " << profile.backward_steps_size()
              << " backward steps, " << profile.activations_size()
              << " activations (" << FormatBytes(act) << ")\n  peak "
              << FormatBytes(profile.measured().peak_bytes()) << ", iteration "
              << absl::StrFormat("%.2f ms", profile.measured().iteration_ms())
              << "\n";
  }
  return kExitOk;
}

int PlotCommand(const ParsedArgs& args) {
  const std::string cmd = "plot";
  if (args.positional.size() != 1 || absl::GetFlag(FLAGS_o).empty()) {
    return BadInput(
        cmd,
        "usage: mutwo plot JOB_ID --kind timeline|batch [--batch N] "
        "[--budget B] -o FILE.svg");
  }
  const std::string kind = absl::GetFlag(FLAGS_kind);
  auto stub = PlannerStub();
  v1::GetJobRequest job_request;
  job_request.set_job_id(args.positional[0]);
  v1::Job job;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub->GetJob(&context, job_request, &job);
    if (!status.ok()) return RpcError(cmd, status);
  }
  LineChart chart;
  if (kind == "batch") {
    if (job.results().empty()) {
      return BadInput(cmd, absl::StrCat("job ", job.job_id(),
                                        " has no profiled batch sizes yet"));
    }
    chart = BatchChart(job);
  } else if (kind == "timeline") {
    auto batch = OneBatch(cmd);
    if (!batch.ok()) return BadInput(cmd, batch.status().message());
    v1::GetProfileRequest profile_request;
    profile_request.set_job_id(job.job_id());
    profile_request.set_batch_size(*batch);
    v1::Profile profile;
    {
      grpc::ClientContext context;
      SetDeadline(context);
      grpc::Status status =
          stub->GetProfile(&context, profile_request, &profile);
      if (!status.ok()) return RpcError(cmd, status);
    }
    v1::GetScheduleRequest request;
    request.set_job_id(job.job_id());
    request.set_batch_size(*batch);
    const auto& budgets = args.Repeated("budget");
    if (budgets.size() > 1) return BadInput(cmd, "give at most one --budget");
    v1::MemoryBudget budget;
    if (!budgets.empty()) {
      auto parsed = ParseBudget(budgets[0]);
      if (!parsed.ok()) return BadInput(cmd, parsed.status().message());
      budget = *parsed;
    } else if (!job.spec().budgets().empty()) {
      budget = job.spec().budgets(0);
    } else {
      budget = *ParseBudget("60%");
    }
    *request.mutable_budget() = budget;
    request.set_include_timeline(true);
    v1::Schedule schedule;
    {
      grpc::ClientContext context;
      SetDeadline(context);
      grpc::Status status = stub->GetSchedule(&context, request, &schedule);
      if (!status.ok()) return RpcError(cmd, status);
    }
    chart =
        TimelineChart(schedule, profile.nodes_size(), job.spec().model_name());
  } else {
    return BadInput(
        cmd, absl::StrCat("--kind \"", kind, "\": use timeline or batch"));
  }
  if (absl::Status s =
          WriteFileAtomically(absl::GetFlag(FLAGS_o), RenderSvg(chart));
      !s.ok()) {
    return BadInput(cmd, s.message());
  }
  std::cerr << "wrote " << absl::GetFlag(FLAGS_o) << "\n";
  return kExitOk;
}

int CancelCommand(const ParsedArgs& args) {
  if (args.positional.size() != 1) {
    return BadInput("cancel", "usage: mutwo cancel JOB_ID");
  }
  v1::CancelJobRequest request;
  request.set_job_id(args.positional[0]);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::Job job;
  grpc::Status status = PlannerStub()->CancelJob(&context, request, &job);
  if (!status.ok()) return RpcError("cancel", status);
  if (JsonOutput()) {
    std::cout << ProtoToJson(job);
  } else {
    std::cout << job.job_id() << " " << v1::Job::State_Name(job.state())
              << "\n";
  }
  return kExitOk;
}

int WorkersCommand(const ParsedArgs&) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ListWorkersResponse response;
  grpc::Status status =
      PlannerStub()->ListWorkers(&context, v1::ListWorkersRequest(), &response);
  if (!status.ok()) return RpcError("workers", status);
  if (JsonOutput()) {
    std::cout << ProtoToJson(response);
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-24s  %-6s  %-30s  %12s  %s\n", "WORKER",
                               "STATE", "DEVICE", "MEMORY", "TASK");
  for (const auto& w : response.workers()) {
    std::cout << absl::StrFormat(
        "%-24s  %-6s  %-30s  %12s  %s\n", w.worker_id(),
        v1::WorkerInfo::State_Name(w.state()), w.device().name(),
        FormatBytes(w.device().total_bytes()), w.current_task_id());
  }
  return kExitOk;
}

}  // namespace mutwo
