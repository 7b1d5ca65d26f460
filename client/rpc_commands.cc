#include "client/rpc_commands.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <variant>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/floor_text.h"
#include "client/interrupt.h"
#include "client/job_watch.h"
#include "client/plot_data.h"
#include "client/plot_render.h"
#include "client/rpc.h"
#include "client/schedule_text.h"
#include "client/text_table.h"
#include "client/time_text.h"
#include "common/flag_values.h"
#include "common/model_archive.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "common/step_flag_help.h"
#include "common/validation_check.h"

ABSL_FLAG(std::string, batch, "",
          "batch sizes: 16, 8,16,32, 8:64 (doubling), 8:64:x2 or 8:32:+8");
ABSL_FLAG(std::string, input, "",
          "a model input NAME:DTYPE[DIMS]{LOW,HIGH} with B for the batch "
          "size, e.g. x:float32[B,3,224,224]; once per forward argument, in "
          "order");
ABSL_FLAG(std::string, unbatched, "", mutwo::kUnbatchedFlagHelp);
ABSL_FLAG(std::string, loss, "mean", mutwo::kLossFlagHelp);
ABSL_FLAG(std::string, optimizer, "sgd", mutwo::kOptimizerFlagHelp);
ABSL_FLAG(double, max_overhead, 0.25,
          "largest iteration-time overhead accepted for the max batch size "
          "with a schedule (0.25 = +25%)");
ABSL_FLAG(std::string, device_kind, "",
          "cpu or cuda: run on workers of this kind (default: any worker)");
ABSL_FLAG(std::string, name, "",
          "display name of the model (default: the file name)");
ABSL_FLAG(std::string, request_id, "",
          "idempotency key: a repeated submit with the same id returns the "
          "first job (default: random)");
ABSL_FLAG(bool, wait, false,
          "follow the job to its end, one progress line per change, then "
          "print the results (exit 3 when a budget fits at no batch size)");
ABSL_FLAG(int32_t, wait_timeout_s, 3600,
          "give up following the job after this many seconds (exit 4)");
ABSL_FLAG(std::string, state, "",
          "only jobs in this state: queued, profiling, planning, validating, "
          "succeeded, failed or cancelled");
ABSL_FLAG(int32_t, limit, 20, "how many jobs to list");
ABSL_FLAG(std::string, format, "text",
          "text, csv or json (--output json means json)");
ABSL_FLAG(std::string, max_model_bytes, "512MiB",
          "refuse model files larger than this before uploading");

ABSL_FLAG(std::string, kind, "timeline",
          "timeline (memory over one step, before and after the schedule), "
          "batch (peak memory vs batch size) or pareto (peak memory vs "
          "iteration time: mutwo's curve, sqrt_n, per_block)");
ABSL_FLAG(std::string, out, "",
          "the file to write: .svg, .png or .pdf (rendered with matplotlib), "
          ".json (the plot data) or .pickle (--kind timeline: a PyTorch "
          "memory snapshot for pytorch.org/memory_viz)");
ABSL_FLAG(std::string, timeline, "planned",
          "the timeline a .pickle snapshot holds: planned (simulated), "
          "baseline (simulated) or measured (the profiler's baseline)");

ABSL_DECLARE_FLAG(std::string, budget);
ABSL_DECLARE_FLAG(std::string, capacity);
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

absl::StatusOr<int64_t> OneBatch() {
  int64_t batch = 0;
  if (!absl::SimpleAtoi(absl::GetFlag(FLAGS_batch), &batch) || batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch must be one positive batch size, got \"",
                     absl::GetFlag(FLAGS_batch), "\""));
  }
  return batch;
}

// The job a command names: a job id, or `latest` (also `-`) for the newest
// job the server lists; one ListJobs call for the shorthand.
absl::StatusOr<std::string> ResolveJobId(v1::Planner::Stub& stub,
                                         const std::string& arg) {
  if (arg != "latest" && arg != "-") return arg;
  v1::ListJobsRequest request;
  request.set_page_size(1);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ListJobsResponse response;
  grpc::Status status = stub.ListJobs(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  if (response.jobs().empty()) {
    return absl::NotFoundError(absl::StrCat("\"", arg,
                                            "\" names the newest job, and ",
                                            ServerAddress(), " has none yet"));
  }
  const std::string& id = response.jobs(0).job_id();
  if (!JsonOutput()) std::cerr << "latest job: " << id << "\n";
  return id;
}

// ResolveJobId for a command: the id, or the exit code of its failure
// (printed as `mutwo COMMAND: ...`).
std::variant<std::string, int> JobIdOrExit(const std::string& command,
                                           v1::Planner::Stub& stub,
                                           const std::string& arg) {
  auto id = ResolveJobId(stub, arg);
  if (id.ok()) return *std::move(id);
  return RpcError(
      command, grpc::Status(static_cast<grpc::StatusCode>(id.status().code()),
                            std::string(id.status().message())));
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
      return "INFEASIBLE";
    case v1::BudgetOutcome::FAILED:
      return "FAILED";
    default:
      return "-";
  }
}

// One max batch answer and how it was proved.
std::string MaxBatchAnswer(int64_t batch, const v1::MaxBatchCheck* check) {
  std::string out = absl::StrCat(batch);
  if (check == nullptr) return out;
  switch (check->state()) {
    case v1::MaxBatchCheck::VERIFIED:
      return absl::StrCat(out, " (verified: ", check->reason(), ")");
    case v1::MaxBatchCheck::VERIFYING:
      return absl::StrCat(out, " (verifying at batch ", check->batch_size(),
                          check->reason().empty() ? "" : ": ", check->reason(),
                          ")");
    case v1::MaxBatchCheck::FAILED:
      return absl::StrCat(out, " (NOT VERIFIED: ", check->reason(), ")");
    case v1::MaxBatchCheck::NOT_VERIFIED:
      return absl::StrCat(out, " (predicted, not verified: ", check->reason(),
                          ")");
    default:
      return absl::StrCat(out, " (predicted)");
  }
}

void PrintMaxBatch(const v1::MaxBatchPrediction& m) {
  const v1::MaxBatchCheck* without = m.has_without_checkpointing_check()
                                         ? &m.without_checkpointing_check()
                                         : nullptr;
  const v1::MaxBatchCheck* with =
      m.has_with_schedule_check() ? &m.with_schedule_check() : without;
  std::cout << "max batch (capacity " << FormatBytes(m.capacity_bytes())
            << "):\n  without checkpointing: "
            << MaxBatchAnswer(m.max_batch_without_checkpointing(), without)
            << "\n  with a schedule (overhead <= " << Pct(m.max_overhead())
            << "): "
            << (m.has_with_schedule_check() || without == nullptr
                    ? MaxBatchAnswer(m.max_batch_with_schedule(), with)
                    : absl::StrCat(m.max_batch_with_schedule(),
                                   " (the same step)"))
            << "\n  prediction: " << m.reason() << "\n";
}

// The training-loop column: the newest report of the budget's schedule
// measured where the user trains (ReportTrainingLoop), "-" without one; a
// report that does not hold adds its problem to `notes`.
std::string TrainingLoopText(const v1::BatchResult& r,
                             const v1::BudgetOutcome* o,
                             const std::string& budget,
                             std::vector<std::string>* notes) {
  if (o == nullptr || o->training_loop_reports() == 0) return "-";
  const v1::TrainingLoopValidation* newest = nullptr;
  for (const v1::TrainingLoopValidation& t : r.training_loop()) {
    if (t.budget().kind_case() == o->budget().kind_case() &&
        FormatBudget(t.budget()) == FormatBudget(o->budget())) {
      newest = &t;
    }
  }
  const std::string peak = FormatBytes(o->training_loop_peak_bytes());
  if (o->validated_in_training_loop()) return absl::StrCat("holds ", peak);
  if (newest != nullptr) {
    notes->push_back(absl::StrCat(
        "batch ", r.batch_size(), ", budget ", budget, ": training loop (",
        v1::TrainingLoopValidation::Path_Name(newest->path()),
        "): ", newest->problem()));
  }
  return absl::StrCat("NOT HOLDING ", peak);
}

// Whether the plans of `r` were made against another measurement than the
// job's own (the schedule cache served plans made from an earlier profile
// of the same model, inputs and device): the step times differ by more
// than timing noise rounds away in the tables.
bool PlannedAgainstAnotherBaseline(const v1::BatchResult& r,
                                   double plan_baseline_ms) {
  return plan_baseline_ms > 0 && r.baseline_iteration_ms() > 0 &&
         std::abs(plan_baseline_ms / r.baseline_iteration_ms() - 1) > 0.005;
}

std::string PlannedElsewhereNote(const v1::BatchResult& r,
                                 double plan_baseline_ms) {
  return absl::StrFormat(
      "batch %d: planned from an earlier profile of this model (the schedule "
      "cache), whose baseline step took %.1f ms; this job measured %.1f ms. "
      "Planned times and overheads are against the plans' own baseline.",
      r.batch_size(), plan_baseline_ms, r.baseline_iteration_ms());
}

// The memory question, per batch size, whether or not budgets were given.
void PrintMemoryTable(const v1::Job& job) {
  TextTable table({"batch", "base peak", "base ms", "floor", "auto budget",
                   "knee peak", "knee ms", "knee overhead", "pareto"},
                  {true, true, true, true, true, true, true, true, true});
  std::vector<std::string> notes;
  for (const v1::BatchResult& r : job.results()) {
    if (r.oom()) {
      table.AddRow({absl::StrCat(r.batch_size()),
                    FormatBytes(r.baseline_peak_bytes()), "-", "-", "-", "-",
                    "-", "-", "out of memory"});
      continue;
    }
    const bool answered = r.floor_bytes() > 0;
    const v1::ParetoPoint& k = r.knee();
    // The knee's time against the baseline it was planned against.
    const double plan_baseline_ms = r.plan_baseline_iteration_ms() > 0
                                        ? r.plan_baseline_iteration_ms()
                                        : r.baseline_iteration_ms();
    if (answered && PlannedAgainstAnotherBaseline(r, plan_baseline_ms)) {
      notes.push_back(PlannedElsewhereNote(r, plan_baseline_ms));
    }
    table.AddRow(
        {absl::StrCat(r.batch_size()), FormatBytes(r.baseline_peak_bytes()),
         absl::StrFormat("%.1f", r.baseline_iteration_ms()),
         answered ? FloorText(r) : "-",
         answered ? FormatBytes(k.budget_bytes()) : "-",
         answered ? FormatBytes(k.predicted_peak_bytes()) : "-",
         answered ? absl::StrFormat("%.1f", k.predicted_iteration_ms()) : "-",
         answered && plan_baseline_ms > 0
             ? Pct(k.predicted_iteration_ms() / plan_baseline_ms - 1)
             : "-",
         answered ? absl::StrCat(r.pareto_size(), " points") : "-"});
  }
  std::cout << "memory per batch size (floor: the lowest budget mutwo fits, "
               "measured by a worker when the job asked for --budget floor, "
               "else predicted; auto: the knee of the Pareto curve)\n"
            << table.Render();
  for (const std::string& note : notes) std::cout << note << "\n";
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
  PrintMemoryTable(job);
  if (job.spec().budgets().empty()) {
    if (job.has_max_batch()) PrintMaxBatch(job.max_batch());
    return;
  }
  std::cout << "budgets (only \"fits\" is measured within the budget; base: "
               "the baseline each plan was made against)\n";
  TextTable table(
      {"batch", "budget", "base peak", "base ms", "plan peak", "plan ms",
       "overhead", "measured", "meas ms", "check", "training loop"},
      {true, false, true, true, true, true, true, true, true, false, false});
  // Why budgets do not fit, printed under the table.
  std::vector<std::string> notes;
  for (const v1::BatchResult& r : job.results()) {
    if (r.oom() || (!r.error().empty() && r.schedules().empty())) {
      table.AddRow({absl::StrCat(r.batch_size()), "-",
                    FormatBytes(r.baseline_peak_bytes()), "-", "-", "-", "-",
                    "-", "-", r.oom() ? "out of memory" : "FAILED", "-"});
      if (!r.oom()) {
        notes.push_back(
            absl::StrCat("batch ", r.batch_size(), ": ", r.error()));
      }
      continue;
    }
    bool plans_noted = false;  // one note per batch size
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
        if (o != nullptr ? IsOutcomeRound(val, *o)
                         : val.budget_bytes() == s.budget_bytes()) {
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
      // The baseline the plan was made against, beside its plan: a plan
      // from the schedule cache was made from an earlier profile.
      const bool own_baseline = s.baseline_iteration_ms() > 0;
      if (own_baseline && !plans_noted &&
          PlannedAgainstAnotherBaseline(r, s.baseline_iteration_ms()) &&
          !PlannedAgainstAnotherBaseline(r, r.plan_baseline_iteration_ms())) {
        notes.push_back(PlannedElsewhereNote(r, s.baseline_iteration_ms()));
        plans_noted = true;
      }
      table.AddRow(
          {absl::StrCat(r.batch_size()), budget,
           FormatBytes(own_baseline ? s.baseline_peak_bytes()
                                    : r.baseline_peak_bytes()),
           absl::StrFormat("%.1f", own_baseline ? s.baseline_iteration_ms()
                                                : r.baseline_iteration_ms()),
           planned ? FormatBytes(s.predicted_peak_bytes())
                   : absl::StrCat("infeasible (floor ",
                                  FormatBytes(s.floor_bytes()), ")"),
           planned ? absl::StrFormat("%.1f", s.predicted_iteration_ms()) : "-",
           planned ? Pct(overhead) : "-", measured, meas_ms, check,
           TrainingLoopText(r, o, budget, &notes)});
    }
    if (!r.error().empty()) {
      notes.push_back(absl::StrCat("batch ", r.batch_size(), ": ", r.error()));
    }
  }
  std::cout << table.Render();
  for (const std::string& note : notes) std::cout << note << "\n";
  if (job.has_max_batch()) PrintMaxBatch(job.max_batch());
}

// Follows a job to its end, prints it and returns the exit code (0, 1, 3
// as FinishedJobExitCode; 4 when the server or the wait gave out; 130 when
// Ctrl-C stopped the following, with the commands that pick the job up).
int FollowAndReport(const std::string& cmd, v1::Planner::Stub& stub,
                    const std::string& job_id, int64_t created_unix_ms,
                    InterruptWatcher& interrupts) {
  FollowCancel cancel;
  interrupts.SetHandler([&cancel] { cancel.Cancel(); });
  auto job = FollowJob(stub, job_id, created_unix_ms,
                       absl::GetFlag(FLAGS_wait_timeout_s), std::cerr, &cancel);
  interrupts.ClearHandler();
  if (!job.ok() && cancel.cancelled()) {
    const std::string flags = ServerFlagsText();
    std::cerr << "\nmutwo " << cmd << ": interrupted; job " << job_id
              << " keeps running on the server.\n"
              << "  follow it again: mutwo watch " << job_id << flags << "\n"
              << "  cancel it:       mutwo cancel " << job_id << flags << "\n";
    return kExitInterrupted;
  }
  if (!job.ok()) {
    std::cerr << "mutwo " << cmd << ": following " << job_id << ": "
              << job.status().message() << "\n";
    return job.status().code() == absl::StatusCode::kUnavailable ||
                   job.status().code() == absl::StatusCode::kDeadlineExceeded
               ? kExitUnavailable
           : job.status().code() == absl::StatusCode::kNotFound ? kExitBadInput
                                                                : kExitFailure;
  }
  if (JsonOutput()) {
    std::cout << ProtoToJson(*job);
  } else {
    PrintJobText(*job);
  }
  return FinishedJobExitCode(*job, std::cerr);
}

// The request of `submit`, checked completely before any upload.
absl::Status BuildSubmitSpec(const ParsedArgs& args, v1::JobSpec& spec) {
  for (const std::string& in : args.Repeated("input")) {
    MUTWO_ASSIGN_OR_RETURN(*spec.add_inputs(), ParseTensorSpec(in));
  }
  MUTWO_RETURN_IF_ERROR(
      ValidateInputs({spec.inputs().begin(), spec.inputs().end()}));
  if (absl::GetFlag(FLAGS_batch).empty()) {
    return absl::InvalidArgumentError("--batch is required, like --batch 8:64");
  }
  MUTWO_ASSIGN_OR_RETURN(std::vector<int64_t> batches,
                         ParseBatchSizes(absl::GetFlag(FLAGS_batch)));
  for (int64_t b : batches) spec.add_batch_sizes(b);
  for (const std::string& b : args.Repeated("budget")) {
    MUTWO_ASSIGN_OR_RETURN(*spec.add_budgets(), ParseBudget(b));
  }
  if (const std::string c = absl::GetFlag(FLAGS_capacity); !c.empty()) {
    auto capacity = ParseBudget(c);
    if (!capacity.ok() ||
        (capacity->kind_case() != v1::MemoryBudget::kBytes &&
         capacity->kind_case() != v1::MemoryBudget::kFractionOfDevice)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--capacity \"", c,
          "\": give bytes (16GiB, 4000MB) or a fraction of the device "
          "(95%dev)"));
    }
    *spec.mutable_capacity() = *std::move(capacity);
  }
  MUTWO_ASSIGN_OR_RETURN(*spec.mutable_loss(),
                         ParseLossFlags(args.Repeated("loss")));
  MUTWO_RETURN_IF_ERROR(
      CheckBatchDims({spec.inputs().begin(), spec.inputs().end()}, &spec.loss(),
                     args.Repeated("unbatched")));
  MUTWO_ASSIGN_OR_RETURN(*spec.mutable_optimizer(),
                         ParseOptimizerSpec(absl::GetFlag(FLAGS_optimizer)));
  const double overhead = absl::GetFlag(FLAGS_max_overhead);
  if (!(overhead >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_overhead ", overhead, ": must be 0 or more (0.25 = +25%)"));
  }
  spec.set_max_overhead(overhead);
  MUTWO_ASSIGN_OR_RETURN(
      std::string kind,
      ParseDeviceKind("--device_kind", absl::GetFlag(FLAGS_device_kind)));
  spec.set_device_kind(kind);
  return absl::OkStatus();
}

}  // namespace

int SubmitCommand(const ParsedArgs& args) {
  const std::string cmd = "submit";
  if (args.positional.size() != 1) {
    return BadInput(cmd,
                    "usage: mutwo submit MODEL.pt --input ... --batch ... "
                    "--budget ... [--wait]; see mutwo submit --help");
  }
  const std::string path = args.positional[0];
  v1::SubmitJobRequest request;
  v1::JobSpec& spec = *request.mutable_spec();
  if (absl::Status s = BuildSubmitSpec(args, spec); !s.ok()) {
    return BadInput(cmd, s.message());
  }
  auto max_bytes = ParseBytes(absl::GetFlag(FLAGS_max_model_bytes));
  if (!max_bytes.ok()) {
    return BadInput(
        cmd, absl::StrCat("--max_model_bytes: ", max_bytes.status().message()));
  }
  auto bytes = ReadFile(path, *max_bytes);
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
  // The server's check at submit (server/job_core.cc), run here before the
  // upload: a job it would refuse (a pickle, a truncated file, an input
  // that names no argument, one missing) costs no upload, and the message
  // is the one the server and the worker give (it names the model as they
  // do, NAME.pt). What the check cannot read leaves the decision to them.
  if (absl::Status s = CheckModelInputs(
          *bytes, absl::StrCat(name, ".pt"),
          {spec.inputs().begin(), spec.inputs().end()}, nullptr);
      s.code() == absl::StatusCode::kInvalidArgument) {
    return BadInput(cmd, s.message());
  }
  request.set_client_request_id(absl::GetFlag(FLAGS_request_id).empty()
                                    ? RandomRequestId()
                                    : absl::GetFlag(FLAGS_request_id));

  // Before the first RPC: the threads gRPC starts inherit the blocked
  // SIGINT (client/interrupt.h). Without --wait, Ctrl-C ends the command.
  InterruptWatcher interrupts;
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
  return FollowAndReport(cmd, *stub, job_id, submitted.job().created_unix_ms(),
                         interrupts);
}

int WatchCommand(const ParsedArgs& args) {
  const std::string cmd = "watch";
  if (args.positional.size() != 1) {
    return BadInput(cmd, "usage: mutwo watch JOB_ID|latest");
  }
  InterruptWatcher interrupts;  // before the first RPC (client/interrupt.h)
  auto stub = PlannerStub();
  auto id = JobIdOrExit(cmd, *stub, args.positional[0]);
  if (const int* exit_code = std::get_if<int>(&id)) return *exit_code;
  v1::GetJobRequest request;
  request.set_job_id(std::get<std::string>(id));
  v1::Job job;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub->GetJob(&context, request, &job);
    if (!status.ok()) return RpcError(cmd, status);
  }
  return FollowAndReport(cmd, *stub, job.job_id(), job.created_unix_ms(),
                         interrupts);
}

int JobsCommand(const ParsedArgs&) {
  v1::ListJobsRequest request;
  if (!absl::GetFlag(FLAGS_state).empty()) {
    std::vector<std::string> names;
    for (int i = v1::Job::State_MIN; i <= v1::Job::State_MAX; ++i) {
      if (i != v1::Job::STATE_UNSPECIFIED && v1::Job::State_IsValid(i)) {
        names.push_back(
            absl::AsciiStrToLower(v1::Job::State_Name(v1::Job::State(i))));
      }
    }
    auto name = ParseChoice("--state", absl::GetFlag(FLAGS_state), names);
    if (!name.ok()) return BadInput("jobs", name.status().message());
    v1::Job::State state;
    v1::Job::State_Parse(absl::AsciiStrToUpper(*name), &state);
    request.add_states(state);
  }
  if (absl::GetFlag(FLAGS_limit) <= 0) {
    return BadInput("jobs", "--limit must be a positive number of jobs");
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
  TextTable table({"JOB", "STATE", "SUBMITTED", "UPDATED", "MODEL", "TASKS",
                   "BATCHES", "BUDGETS"},
                  {false, false, false, false, false, true, false, false});
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (const v1::Job& j : response.jobs()) {
    std::vector<std::string> budgets;
    for (const auto& b : j.spec().budgets()) {
      budgets.push_back(b.text().empty() ? FormatBudget(b) : b.text());
    }
    table.AddRow({j.job_id(), v1::Job::State_Name(j.state()),
                  DateTimeText(j.created_unix_ms(), absl::LocalTimeZone()),
                  AgoText(j.updated_unix_ms(), now_ms), j.spec().model_name(),
                  absl::StrCat(j.tasks_done(), "/", j.tasks_total()),
                  absl::StrJoin(j.spec().batch_sizes(), ","),
                  absl::StrJoin(budgets, ",")});
  }
  std::cout << table.Render();
  return kExitOk;
}

int JobCommand(const ParsedArgs& args) {
  const std::string cmd = "job";
  if (args.positional.size() != 1) {
    return BadInput(cmd, "usage: mutwo job JOB_ID|latest");
  }
  auto stub = PlannerStub();
  auto id = JobIdOrExit(cmd, *stub, args.positional[0]);
  if (const int* exit_code = std::get_if<int>(&id)) return *exit_code;
  v1::GetJobRequest request;
  request.set_job_id(std::get<std::string>(id));
  grpc::ClientContext context;
  SetDeadline(context);
  v1::Job job;
  grpc::Status status = stub->GetJob(&context, request, &job);
  if (!status.ok()) return RpcError(cmd, status);
  if (JsonOutput()) {
    std::cout << ProtoToJson(job);
  } else {
    PrintJobText(job);
  }
  // A job still running has no verdict yet; a final one exits as `watch`
  // would have, so a script can tell a failed job from a good one.
  const bool final = job.state() == v1::Job::SUCCEEDED ||
                     job.state() == v1::Job::FAILED ||
                     job.state() == v1::Job::CANCELLED;
  // With --output json the JSON alone is the answer (its outcomes say which
  // budget fits nowhere): no lines on stderr for a reader that merges them.
  std::ostringstream quiet;
  return final ? FinishedJobExitCode(job, JsonOutput() ? quiet : std::cerr)
               : kExitOk;
}

int ScheduleCommand(const ParsedArgs& args) {
  const std::string cmd = "schedule";
  if (args.positional.size() != 1) {
    return BadInput(
        cmd, "usage: mutwo schedule JOB_ID|latest --batch N [--budget B]");
  }
  auto batch = OneBatch();
  if (!batch.ok()) return BadInput(cmd, batch.status().message());
  v1::GetScheduleRequest request;
  request.set_batch_size(*batch);
  const auto& budgets = args.Repeated("budget");
  if (budgets.size() > 1) return BadInput(cmd, "give at most one --budget");
  auto budget = ParseBudget(budgets.empty() ? "60%" : budgets[0]);
  if (!budget.ok()) return BadInput(cmd, budget.status().message());
  *request.mutable_budget() = *budget;
  auto policy = ParseChoice("--policy", absl::GetFlag(FLAGS_policy),
                            {"mutwo", "sqrt_n", "per_block", "none"});
  if (!policy.ok()) return BadInput(cmd, policy.status().message());
  v1::Policy p = v1::MUTWO;
  v1::Policy_Parse(absl::AsciiStrToUpper(*policy), &p);
  request.set_policy(p);
  request.set_include_pareto(absl::GetFlag(FLAGS_pareto));
  auto stub = PlannerStub();
  auto id = JobIdOrExit(cmd, *stub, args.positional[0]);
  if (const int* exit_code = std::get_if<int>(&id)) return *exit_code;
  request.set_job_id(std::get<std::string>(id));
  v1::Schedule schedule;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub->GetSchedule(&context, request, &schedule);
    if (!status.ok()) return RpcError(cmd, status);
  }
  if (JsonOutput()) {
    std::cout << ProtoToJson(schedule);
    return schedule.feasible() ? kExitOk : kExitInfeasible;
  }
  // The profile names the decisions' nodes (op kind, module scope); without
  // it the list still has ids and sizes.
  std::optional<v1::Profile> profile;
  if (schedule.recomputed() + schedule.swapped() > 0) {
    v1::GetProfileRequest profile_request;
    profile_request.set_job_id(request.job_id());
    profile_request.set_batch_size(*batch);
    grpc::ClientContext context;
    SetDeadline(context);
    v1::Profile p;
    if (stub->GetProfile(&context, profile_request, &p).ok()) profile = p;
  }
  std::cout << "policy " << v1::Policy_Name(schedule.policy()) << ", batch "
            << schedule.batch_size() << ": "
            << (schedule.feasible() ? "feasible" : "INFEASIBLE")
            << (schedule.measured_peak_bytes() > 0
                    ? absl::StrCat(", measured peak ",
                                   FormatBytes(schedule.measured_peak_bytes()))
                    : "")
            << "\n"
            << (schedule.correction_bytes() > 0
                    ? absl::StrCat("  correction  planned ",
                                   FormatBytes(schedule.correction_bytes()),
                                   " below the budget (learned from "
                                   "validations)\n")
                    : "")
            << ScheduleText(schedule, profile ? &*profile : nullptr,
                            "predicted unless the job measured it: mutwo job",
                            2);
  return schedule.feasible() ? kExitOk : kExitInfeasible;
}

int ProfileCommand(const ParsedArgs& args) {
  const std::string cmd = "profile";
  if (args.positional.size() != 1) {
    return BadInput(
        cmd, "usage: mutwo profile JOB_ID --batch N [--format csv|json|text]");
  }
  auto batch = OneBatch();
  if (!batch.ok()) return BadInput(cmd, batch.status().message());
  auto format = ParseChoice("--format", absl::GetFlag(FLAGS_format),
                            {"text", "csv", "json"});
  if (!format.ok()) return BadInput(cmd, format.status().message());
  if (JsonOutput()) *format = "json";
  auto stub = PlannerStub();
  auto id = JobIdOrExit(cmd, *stub, args.positional[0]);
  if (const int* exit_code = std::get_if<int>(&id)) return *exit_code;
  v1::GetProfileRequest request;
  request.set_job_id(std::get<std::string>(id));
  request.set_batch_size(*batch);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::Profile profile;
  grpc::Status status = stub->GetProfile(&context, request, &profile);
  if (!status.ok()) return RpcError(cmd, status);
  if (*format == "json") {
    std::cout << ProtoToJson(profile);
  } else if (*format == "csv") {
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
  const std::string out = absl::GetFlag(FLAGS_out);
  if (args.positional.size() != 1 || out.empty()) {
    return BadInput(cmd,
                    "usage: mutwo plot JOB_ID --kind timeline|batch|pareto "
                    "[--batch N] [--budget B] -o FILE.svg|.png|.pdf|.json"
                    "|.pickle");
  }
  auto kind = ParseChoice("--kind", absl::GetFlag(FLAGS_kind),
                          {"timeline", "batch", "pareto"});
  if (!kind.ok()) return BadInput(cmd, kind.status().message());
  // Everything checkable is checked before the first RPC.
  const std::string ext = absl::AsciiStrToLower(
      out.rfind('.') == std::string::npos ? "" : out.substr(out.rfind('.')));
  if (ext != ".svg" && ext != ".png" && ext != ".pdf" && ext != ".json" &&
      ext != ".pickle") {
    return BadInput(cmd, absl::StrCat("-o ", out,
                                      ": write .svg, .png or .pdf (rendered "
                                      "with matplotlib), .json (the plot "
                                      "data) or .pickle (--kind timeline: a "
                                      "PyTorch memory snapshot)"));
  }
  if (ext == ".pickle" && *kind != "timeline") {
    return BadInput(cmd,
                    "a .pickle memory snapshot is a timeline: use "
                    "--kind timeline");
  }
  auto timeline = ParseChoice("--timeline", absl::GetFlag(FLAGS_timeline),
                              {"planned", "baseline", "measured"});
  if (!timeline.ok()) return BadInput(cmd, timeline.status().message());
  if (args.Given("timeline") && ext != ".pickle") {
    return BadInput(cmd,
                    "--timeline chooses the memory snapshot of a "
                    ".pickle; the plots show all three");
  }
  std::optional<int64_t> batch;
  std::optional<v1::MemoryBudget> budget;
  const auto& budgets = args.Repeated("budget");
  if (*kind != "batch") {
    auto b = OneBatch();
    if (!b.ok()) return BadInput(cmd, b.status().message());
    batch = *b;
    if (budgets.size() > 1) return BadInput(cmd, "give at most one --budget");
    if (!budgets.empty()) {
      auto parsed = ParseBudget(budgets[0]);
      if (!parsed.ok()) return BadInput(cmd, parsed.status().message());
      budget = *parsed;
    }
  } else if (!budgets.empty() || !absl::GetFlag(FLAGS_batch).empty()) {
    return BadInput(cmd,
                    "--kind batch plots every batch size and budget of the "
                    "job; --batch and --budget are for --kind timeline and "
                    "pareto");
  }
  auto stub = PlannerStub();
  auto id = JobIdOrExit(cmd, *stub, args.positional[0]);
  if (const int* exit_code = std::get_if<int>(&id)) return *exit_code;
  v1::GetJobRequest job_request;
  job_request.set_job_id(std::get<std::string>(id));
  v1::Job job;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub->GetJob(&context, job_request, &job);
    if (!status.ok()) return RpcError(cmd, status);
  }
  auto get_schedule = [&](v1::Policy policy, bool pareto, bool curve,
                          v1::Schedule* schedule) {
    v1::GetScheduleRequest request;
    request.set_job_id(job.job_id());
    request.set_batch_size(*batch);
    *request.mutable_budget() = *budget;
    request.set_policy(policy);
    request.set_include_pareto(pareto);
    request.set_include_timeline(curve);
    grpc::ClientContext context;
    SetDeadline(context);
    return stub->GetSchedule(&context, request, schedule);
  };
  if (*kind != "batch" && !budget.has_value()) {
    budget = job.spec().budgets().empty() ? *ParseBudget("60%")
                                          : job.spec().budgets(0);
  }
  google::protobuf::Struct data;
  if (*kind == "batch") {
    if (job.results().empty()) {
      return BadInput(cmd, absl::StrCat("job ", job.job_id(),
                                        " has no profiled batch sizes yet"));
    }
    data = BatchPlotData(job);
  } else if (*kind == "pareto") {
    v1::Schedule mutwo;
    if (grpc::Status s = get_schedule(v1::MUTWO, true, false, &mutwo);
        !s.ok()) {
      return RpcError(cmd, s);
    }
    std::vector<v1::Schedule> others;
    for (v1::Policy policy : {v1::SQRT_N, v1::PER_BLOCK}) {
      v1::Schedule schedule;
      if (grpc::Status s = get_schedule(policy, false, false, &schedule);
          !s.ok()) {
        return RpcError(cmd, s);
      }
      others.push_back(std::move(schedule));
    }
    const v1::BatchResult* result = nullptr;
    for (const v1::BatchResult& r : job.results()) {
      if (r.batch_size() == *batch) result = &r;
    }
    data = ParetoPlotData(mutwo, others, job.spec().model_name(), result);
  } else {
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
    v1::Schedule schedule;
    if (grpc::Status s = get_schedule(v1::MUTWO, false, true, &schedule);
        !s.ok()) {
      return RpcError(cmd, s);
    }
    data = TimelinePlotData(schedule, profile, job.spec().model_name());
  }
  const std::string json = PlotDataJson(data);
  if (ext == ".json") {
    if (absl::Status s = WriteFileAtomically(out, json); !s.ok()) {
      return BadInput(cmd, s.message());
    }
  } else {
    std::vector<std::string> extra;
    if (ext == ".pickle") extra.push_back("--timeline=" + *timeline);
    if (absl::Status s = RenderPlot(json, out, extra); !s.ok()) {
      std::cerr << "mutwo " << cmd << ": " << s.message() << "\n";
      return s.code() == absl::StatusCode::kInvalidArgument ? kExitBadInput
                                                            : kExitFailure;
    }
  }
  if (JsonOutput()) {
    std::cout << "{\"file\": " << JsonQuote(out) << ", \"kind\": \"" << *kind
              << "\"}\n";
  } else {
    std::cout << "wrote " << out << "\n";
  }
  return kExitOk;
}

int CancelCommand(const ParsedArgs& args) {
  if (args.positional.size() != 1) {
    return BadInput("cancel", "usage: mutwo cancel JOB_ID");
  }
  // Cancelling "the newest job" could reach a job submitted a moment ago
  // by someone else; cancel takes the id only.
  if (args.positional[0] == "latest" || args.positional[0] == "-") {
    return BadInput("cancel",
                    "cancel needs the job's id, not \"latest\": `mutwo "
                    "jobs` lists them");
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
  TextTable table({"WORKER", "STATE", "KIND", "DEVICE", "MEMORY", "TASK"},
                  {false, false, false, false, true, false});
  for (const auto& w : response.workers()) {
    table.AddRow({w.worker_id(), v1::WorkerInfo::State_Name(w.state()),
                  w.device().kind(), w.device().name(),
                  FormatBytes(w.device().total_bytes()),
                  w.current_task_id().empty() ? "-" : w.current_task_id()});
  }
  std::cout << table.Render();
  return kExitOk;
}

}  // namespace mutwo
