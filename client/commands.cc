#include "client/commands.h"

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/plan_command.h"
#include "client/rpc.h"
#include "client/rpc_commands.h"
#include "common/args.h"
#include "common/logging.h"
#include "common/proto_io.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(std::string, output);

namespace mutwo {
namespace {

constexpr char kUsage[] =
    "mutwo: plan activation recompute/swap schedules for training jobs.\n\n"
    "Usage: mutwo COMMAND [ARGS] [flags]\n\n"
    "Commands:\n"
    "  submit MODEL.pt --input NAME:DTYPE[DIMS] [--input ...] --batch "
    "8:64[:x2]\n"
    "            --budget 60% [--budget 4GiB] [--loss ...] [--optimizer ...]\n"
    "            [--wait]   upload a TorchScript model and submit a job\n"
    "  jobs      list jobs (--state, --limit)\n"
    "  job ID    a job's state and results table\n"
    "  schedule ID --batch N [--budget B] [--policy P] [--pareto]\n"
    "            a schedule (from the cache, or planned for a new budget)\n"
    "  profile ID --batch N [--format text|csv|json]   the measured profile\n"
    "  plot ID --kind timeline|batch [--batch N] [--budget B] -o FILE.svg\n"
    "            memory timeline before/after, or peak memory vs batch size\n"
    "  cancel ID cancel a job\n"
    "  workers   registered workers\n"
    "  health    check that the server answers and is SERVING\n"
    "  plan      plan a schedule offline from a profile JSON file:\n"
    "            mutwo plan PROFILE.json --budget 60%|4GiB|4000MB\n"
    "            [--policy mutwo|sqrt_n|per_block|none] [--pareto]\n"
    "  max-batch PROFILE.json PROFILE.json [...] [--capacity 80GiB]\n"
    "            [--max_overhead 0.25]   largest batch that fits, offline\n\n"
    "Exit codes: 0 ok, 1 failed, 2 bad input, 3 infeasible budget, "
    "4 server unavailable or deadline exceeded.";

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
    std::cerr << "mutwo health: " << absl::GetFlag(FLAGS_server) << ": "
              << status.error_message() << "\n";
    return ExitCodeFor(status);
  }
  const bool serving =
      response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  const char* state = serving ? "SERVING" : "NOT_SERVING";
  if (json) {
    std::cout << "{\"status\": \"" << state << "\"}\n";
  } else {
    std::cout << absl::GetFlag(FLAGS_server) << ": " << state << "\n";
  }
  return serving ? kExitOk : kExitFailure;
}

}  // namespace

int RunCli(int argc, char** argv) {
  const std::map<std::string, std::function<int(const ParsedArgs&)>> commands =
      {{"health", Health},
       {"plan", PlanCommand},
       {"submit", SubmitCommand},
       {"jobs", JobsCommand},
       {"job", JobCommand},
       {"schedule", ScheduleCommand},
       {"profile", ProfileCommand},
       {"plot", PlotCommand},
       {"cancel", CancelCommand},
       {"workers", WorkersCommand},
       {"max-batch", MaxBatchCommand}};
  auto args = ParseArgs(argc, argv, 1, {"input", "budget"});
  if (!args.ok()) {
    std::cerr << "mutwo: " << args.status().message() << "\n";
    return kExitBadInput;
  }
  if (args->help || args->positional.empty()) {
    (args->help ? std::cout : std::cerr) << UsageWithFlags(kUsage);
    return args->help ? kExitOk : kExitBadInput;
  }
  const std::string name = args->positional.front();
  auto it = commands.find(name);
  if (it == commands.end()) {
    std::cerr << "mutwo: unknown command \"" << name
              << "\"; see mutwo --help\n";
    return kExitBadInput;
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "text" && output != "json") {
    std::cerr << "mutwo: --output \"" << output << "\": use text or json\n";
    return kExitBadInput;
  }
  (void)InitLogging("mutwo", "warn");
  args->positional.erase(args->positional.begin());
  return it->second(*args);
}

}  // namespace mutwo
