#include "client/commands.h"

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/plan_command.h"
#include "client/rpc.h"
#include "client/rpc_commands.h"
#include "common/args.h"
#include "common/command_table.h"
#include "common/flag_values.h"
#include "common/logging.h"
#include "common/proto_io.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_DECLARE_FLAG(std::string, output);

namespace mutwo {
namespace {

// Health: grpc.health.v1.Health/Check for the whole server ("").
int Health(const ParsedArgs&) {
  auto stub = grpc::health::v1::Health::NewStub(ServerChannel());
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  const bool json = JsonOutput();
  if (!status.ok()) {
    if (json) {
      std::cout << "{\"status\": \"UNAVAILABLE\", \"error\": "
                << JsonQuote(status.error_message()) << "}\n";
    }
    std::cerr << "mutwo health: " << ServerAddress() << ": "
              << status.error_message() << "\n";
    return ExitCodeFor(status);
  }
  const bool serving =
      response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  const char* state = serving ? "SERVING" : "NOT_SERVING";
  if (json) {
    std::cout << "{\"status\": \"" << state << "\"}\n";
  } else {
    std::cout << ServerAddress() << ": " << state << "\n";
  }
  return serving ? kExitOk : kExitFailure;
}

// The flags of every command that talks to the server.
std::vector<std::string> Rpc(std::vector<std::string> flags) {
  for (const char* f : {"server", "timeout_ms", "token_file", "tls_ca"}) {
    flags.push_back(f);
  }
  return flags;
}

std::vector<CommandSpec> Commands() {
  return {
      {"submit",
       "MODEL.pt --input NAME:DTYPE[B,...] [--input ...] --batch 8:64 "
       "[--budget 60%|4GiB|auto ...] [--capacity 16GiB] [--wait]",
       "upload a TorchScript model and submit a job",
       "Everything given is checked before the upload: inputs (each needs "
       "the batch\ndimension B unless --unbatched names it), batch sizes, "
       "budgets, loss,\noptimizer and device kind. Every job answers, per "
       "batch size, the baseline\npeak, the floor, the Pareto curve and its "
       "knee; with two or more batch sizes\nthe max batch for --capacity, "
       "verified by a step on a worker. With --wait:\none progress line per "
       "change on stderr, then the results; exit 3 when a\nbudget fits at "
       "no batch size; Ctrl-C stops following (exit 130), prints how to\n"
       "watch or cancel the job, and leaves it running.",
       Rpc({"input", "unbatched", "batch", "budget", "capacity", "loss",
            "optimizer", "max_overhead", "device_kind", "name", "request_id",
            "wait", "wait_timeout_s", "max_model_bytes"}),
       {{"budget",
         "memory budget, repeatable: 60% (of the baseline peak), 80%dev (of "
         "the device), 4GiB or 4000MB, auto (the knee of the Pareto "
         "curve) or floor (the lowest budget that fits, measured by a "
         "worker: the answer's floor is then marked measured); a bare "
         "number is refused"},
        {"capacity",
         "memory the max batch is predicted and verified for: 16GiB or "
         "95%dev (default: 95% of the device; on the CPU the max batch is "
         "then not verified by execution)"},
        {"max_overhead",
         "largest iteration-time overhead accepted for the max batch size "
         "with a schedule (0.25 = +25%)"}},
       SubmitCommand},
      {"watch",
       "JOB_ID|latest",
       "follow a running job: progress lines, then its results",
       "Re-attaches to a job submitted earlier (or by someone else). Exit "
       "codes as\nsubmit --wait: 0 done and every budget fits at some batch "
       "size, 1 failed\nor cancelled, 3 a budget fits at no batch size, 4 "
       "server gone or\n--wait_timeout_s passed, 130 Ctrl-C (the job keeps "
       "running; the lines\nprinted say how to watch or cancel it).",
       Rpc({"wait_timeout_s"}),
       {},
       WatchCommand},
      {"jobs",
       "[--state STATE] [--limit N]",
       "list jobs, newest first",
       "SUBMITTED is the local time the job was submitted, UPDATED how long "
       "ago it\nlast changed.",
       Rpc({"state", "limit"}),
       {},
       JobsCommand},
      {"job",
       "JOB_ID|latest",
       "a job's state and results table",
       "Exit codes: 0 the job runs, or it succeeded and every budget fits "
       "at some\nbatch size; 1 it failed or was cancelled; 3 it succeeded but "
       "a budget fits at\nno batch size (as watch).",
       Rpc({}),
       {},
       JobCommand},
      {"schedule",
       "JOB_ID|latest --batch N [--budget B] [--policy P] [--pareto]",
       "a schedule, from the cache or planned for a new budget",
       "Lists every activation recomputed or swapped. Exit 3 when "
       "infeasible.",
       Rpc({"batch", "budget", "policy", "pareto"}),
       {{"batch", "the batch size"},
        {"budget", "memory budget: 60%, 80%dev, 4GiB or auto (default: 60%)"}},
       ScheduleCommand},
      {"profile",
       "JOB_ID|latest --batch N [--format text|csv|json]",
       "the measured profile of one batch size",
       "",
       Rpc({"batch", "format"}),
       {{"batch", "the batch size"}},
       ProfileCommand},
      {"plot",
       "JOB_ID|latest --kind timeline --batch N [--budget B] -o FILE.svg\n"
       "       mutwo plot JOB_ID --kind pareto --batch N [--budget B] -o "
       "FILE.png\n"
       "       mutwo plot JOB_ID --kind batch -o FILE.pdf",
       "plot memory over a step, peak vs batch size or vs time",
       "timeline: the high-water mark during each op over time, without and "
       "with the\nschedule (simulated) and as the profiler measured it, the "
       "budget, the peaks;\nan infeasible schedule is marked. batch: peak "
       "memory per batch size and budget,\npredicted and measured, "
       "infeasible requests, the capacity and the max batch.\npareto: "
       "mutwo's peak vs iteration-time curve beside sqrt_n and per_block.\n"
       "-o FILE.json writes the plot data; -o FILE.pickle (timeline) a "
       "PyTorch memory\nsnapshot (https://pytorch.org/memory_viz) and "
       "FILE.html beside it, a page\nthat opens offline (mutwo_plot.py "
       "FILE.pickle FILE.html converts one).\n"
       "Rendering runs mutwo_plot.py (share/mutwo/ next to the binary) "
       "with a\nPython that has matplotlib: $MUTWO_PYTHON, python3 or "
       "/usr/bin/python3.",
       Rpc({"kind", "batch", "budget", "out", "timeline"}),
       {{"batch", "timeline, pareto: the batch size"},
        {"budget",
         "timeline, pareto: memory budget, 60%, 80%dev or 4GiB (default: "
         "the job's first)"}},
       PlotCommand},
      {"cancel", "JOB_ID", "cancel a job", "", Rpc({}), {}, CancelCommand},
      {"workers", "", "registered workers", "", Rpc({}), {}, WorkersCommand},
      {"health",
       "",
       "check that the server answers and is SERVING",
       "",
       Rpc({}),
       {},
       Health},
      {"plan",
       "PROFILE.json --budget B [--policy P] [--pareto]\n"
       "       mutwo plan PROFILE.json PROFILE.json [...] --batch N --budget B",
       "plan a schedule offline from profile JSON (no server)",
       "With several profiles of one model, plans at --batch from the "
       "profile fitted\nto them. --budget auto plans at the knee of the "
       "Pareto curve, --budget floor\nat the lowest budget it predicts "
       "(predicted: nothing is run; submit\n--budget floor measures it). "
       "Exit 3 when the budget is below the floor.",
       {"budget", "policy", "pareto", "reserve", "swap", "batch"},
       {{"batch",
         "with several profiles: the batch size to plan at (may be larger "
         "than any profiled)"}},
       PlanCommand},
      {"max-batch",
       "PROFILE.json PROFILE.json [...] [--capacity 80GiB]",
       "largest batch that fits, predicted offline from profiles",
       "Predicted peaks are grown by what the profiles measured above the "
       "simulation\n(fragmentation) and compared with the capacity less the "
       "allocator reserve;\nthe answer says how far it extrapolated, with a "
       "warning on stderr beyond 4x\nthe largest profiled batch size. Not "
       "verified by execution: submit\nthe batch sizes with --capacity for "
       "that.",
       {"capacity", "max_overhead"},
       {},
       MaxBatchCommand},
  };
}

}  // namespace

int RunCli(int argc, char** argv) {
  CommandTableOptions options;
  options.program = "mutwo";
  options.description =
      "mutwo: plan activation recompute/swap schedules for training jobs.\n"
      "The server is --server, else $MUTWO_SERVER, else 127.0.0.1:50051; "
      "JOB_ID may\nbe `latest` (or -): the newest job.";
  options.footer =
      "Exit codes: 0 ok, 1 failed, 2 bad input, 3 a budget does not fit, "
      "4 server\nunavailable or deadline exceeded, 130 interrupted.";
  options.global_flags = {"output"};
  options.parse.repeated = {"input", "budget", "unbatched", "loss"};
  options.parse.short_names = {{"o", "out"}};
  options.before_run = [](const CommandSpec&) -> absl::Status {
    auto output =
        ParseChoice("--output", absl::GetFlag(FLAGS_output), {"text", "json"});
    if (!output.ok()) return output.status();
    absl::SetFlag(&FLAGS_output, *output);
    (void)InitLogging("mutwo", "warn");
    return absl::OkStatus();
  };
  const CommandTable table(std::move(options), Commands());
  return table.Run(argc, argv);
}

}  // namespace mutwo
