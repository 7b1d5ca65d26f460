#include "client/plan_command.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/schedule_text.h"
#include "common/flag_values.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "mutwo/v1/types.pb.h"
#include "planner/plan_request.h"
#include "planner/proto_convert.h"

ABSL_FLAG(std::string, budget, "",
          "memory budget: 60% (of the baseline peak), 80%dev (of the "
          "device), 4GiB or 4000MB, auto (the knee of the Pareto curve) or "
          "floor (the lowest budget the plan is predicted to fit); a bare "
          "number is refused");
ABSL_FLAG(std::string, policy, "mutwo", "mutwo, sqrt_n, per_block or none");
ABSL_FLAG(bool, pareto, false,
          "add the Pareto curve (20 budgets from the floor to the baseline "
          "peak)");
ABSL_FLAG(bool, reserve, true,
          "μ-TWO plans below the budget by the device reserve (CUDA: "
          "4 MiB + 1% for the caching allocator; CPU: 16 KiB + 1.5% for what "
          "the memory model leaves out of replays); --reserve=false plans to "
          "the budget itself");
ABSL_FLAG(bool, swap, true,
          "μ-TWO may swap activations to the host; --swap=false plans "
          "recomputation only (for torch.compile, where mutwo.apply's "
          "selective-checkpointing policy has no swap)");
ABSL_DECLARE_FLAG(std::string, output);
ABSL_DECLARE_FLAG(std::string, batch);

namespace mutwo {
namespace {

constexpr int64_t kMaxProfileFileBytes = int64_t{1} << 30;
constexpr int kParetoPoints = 20;

int BadInput(const std::string& message) {
  std::cerr << "mutwo plan: " << message << "\n";
  return kExitBadInput;
}

void PrintText(const std::string& path, const v1::Schedule& s,
               const v1::Profile* profile) {
  std::cout << "Schedule for " << path << " (batch " << s.batch_size()
            << ", policy " << v1::Policy_Name(s.policy()) << ", "
            << s.planner_version() << ")\n";
  // Planned from a profile, nothing run: the floor is the memory model's.
  std::cout << ScheduleText(
      s, profile, "predicted; `mutwo submit --budget floor` measures it", 2);
}

}  // namespace

int PlanCommand(const ParsedArgs& args) {
  if (args.positional.empty()) {
    return BadInput(
        "usage: mutwo plan PROFILE.json --budget 60%|4GiB|4000MB|auto "
        "[--policy mutwo|sqrt_n|per_block|none] [--pareto] "
        "[--output json|text]\n"
        "       mutwo plan PROFILE.json PROFILE.json [...] --batch N --budget "
        "... (one model profiled at two or more batch sizes, planned at "
        "batch N from the fitted profile)");
  }
  // Several profiles: plan at --batch from the profile fitted to it.
  int64_t at_batch = 0;
  const std::string batch_text = absl::GetFlag(FLAGS_batch);
  if (args.positional.size() > 1 || !batch_text.empty()) {
    if (args.positional.size() < 2) {
      return BadInput("--batch needs profiles at two or more batch sizes");
    }
    if (!absl::SimpleAtoi(batch_text, &at_batch) || at_batch <= 0) {
      return BadInput(absl::StrCat(
          "--batch \"", batch_text,
          "\": with several profiles, give the batch size to plan (N > 0)"));
    }
  }
  const std::string& path = args.positional[0];
  std::string budget_text = absl::GetFlag(FLAGS_budget);
  const std::vector<std::string>& repeated = args.Repeated("budget");
  if (repeated.size() > 1) return BadInput("give one --budget");
  if (!repeated.empty()) budget_text = repeated[0];
  if (budget_text.empty()) {
    return BadInput("--budget is required: 60%, 80%dev, 4GiB, 4000MB or auto");
  }
  auto budget = ParseBudget(budget_text);
  if (!budget.ok()) return BadInput(std::string(budget.status().message()));
  auto policy = planner::ParsePolicy(absl::GetFlag(FLAGS_policy));
  if (!policy.ok()) return BadInput(std::string(policy.status().message()));

  std::vector<v1::Profile> profiles;
  for (const std::string& file : args.positional) {
    auto bytes = ReadFile(file, kMaxProfileFileBytes);
    if (!bytes.ok()) return BadInput(std::string(bytes.status().message()));
    v1::Profile& profile = profiles.emplace_back();
    if (absl::Status s = ProtoFromJson(*bytes, file, &profile); !s.ok()) {
      return BadInput(std::string(s.message()));
    }
  }
  planner::ScheduleRequest request;
  request.budget = *budget;
  request.policy = planner::PolicyToProto(*policy);
  request.pareto_points = absl::GetFlag(FLAGS_pareto) ? kParetoPoints : 0;
  request.device_reserve = absl::GetFlag(FLAGS_reserve);
  request.allow_swap = absl::GetFlag(FLAGS_swap);
  auto schedule =
      at_batch > 0 ? planner::PlanScheduleAtBatch(profiles, at_batch, request)
                   : planner::PlanSchedule(profiles.front(), request);
  if (!schedule.ok()) {
    return BadInput(absl::StrCat(path, ": ", schedule.status().message()));
  }
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << ProtoToJson(*schedule) << "\n";
  } else {
    // Node names from the first profile (all profiles share the graph).
    PrintText(path, *schedule, &profiles.front());
  }
  if (!schedule->feasible()) {
    std::cerr << "mutwo plan: infeasible: the budget "
              << FormatBytes(schedule->budget_bytes()) << " is below the floor "
              << FormatBytes(schedule->floor_bytes())
              << " (the lowest budget the " << absl::GetFlag(FLAGS_policy)
              << " policy fits; baseline peak "
              << FormatBytes(schedule->baseline_peak_bytes()) << ")\n";
    return kExitInfeasible;
  }
  return kExitOk;
}

}  // namespace mutwo

ABSL_FLAG(std::string, capacity, "",
          "memory capacity, e.g. 80GiB (default: 95% of the profiled "
          "device's memory)");
ABSL_DECLARE_FLAG(double, max_overhead);

namespace mutwo {

int MaxBatchCommand(const ParsedArgs& args) {
  const std::string cmd = "mutwo max-batch: ";
  if (args.positional.size() < 2) {
    std::cerr << cmd
              << "usage: mutwo max-batch PROFILE.json PROFILE.json [...] "
                 "[--capacity 80GiB] [--max_overhead 0.25] [--output json|text]"
                 " (profiles of one model at two or more batch sizes)\n";
    return kExitBadInput;
  }
  // Flags before files: a bad flag is reported without reading anything.
  int64_t capacity = 0;
  if (!absl::GetFlag(FLAGS_capacity).empty()) {
    auto bytes = ParseMemorySize("--capacity", absl::GetFlag(FLAGS_capacity));
    if (!bytes.ok()) {
      std::cerr << cmd << bytes.status().message() << "\n";
      return kExitBadInput;
    }
    capacity = *bytes;
  }
  std::vector<v1::Profile> profiles;
  for (const std::string& path : args.positional) {
    v1::Profile profile;
    if (absl::Status s = ReadProtoJsonFile(path, &profile); !s.ok()) {
      std::cerr << cmd << s.message() << "\n";
      return kExitBadInput;
    }
    profiles.push_back(std::move(profile));
  }
  auto prediction = planner::PredictMaxBatchProto(
      profiles, capacity, absl::GetFlag(FLAGS_max_overhead));
  if (!prediction.ok()) {
    std::cerr << cmd << prediction.status().message() << "\n";
    return kExitBadInput;
  }
  // Two or three profiled batch sizes fit a line; far beyond them, memory
  // that does not grow linearly with the batch (workspaces, allocator
  // rounding, a layer whose activations grow faster) is not seen, and a
  // capacity defaulted from the profiled device (the host's RAM on the CPU)
  // invites answers hundreds of times the largest batch profiled.
  constexpr double kFarExtrapolation = 4.0;
  if (prediction->extrapolation() > kFarExtrapolation) {
    const int64_t largest =
        *std::max_element(prediction->profiled_batch_sizes().begin(),
                          prediction->profiled_batch_sizes().end());
    std::cerr << cmd << "warning: the answer ("
              << prediction->max_batch_with_schedule()
              << ") is "
              // As the answer's own line below prints it
              // (planner/max_batch.cc): one factor, not 17x and 16.8x.
              << absl::StrFormat("%.1fx", prediction->extrapolation())
              << " the largest profiled batch size (" << largest
              << "): a straight line fitted to batch sizes "
              << absl::StrJoin(prediction->profiled_batch_sizes(), ", ")
              << ", extended that far, misses memory that grows otherwise. "
                 "Profile a batch size near the answer"
              << (capacity == 0
                      ? absl::StrCat(
                            ", or give --capacity for the memory you will "
                            "train with (the default, 95% of the profiled "
                            "device ",
                            profiles.front().device().name(), ", is ",
                            FormatBytes(prediction->capacity_bytes()), ")")
                      : "")
              << ".\n";
  }
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << ProtoToJson(*prediction);
  } else {
    std::cout << "capacity " << FormatBytes(prediction->capacity_bytes())
              << ": max batch " << prediction->max_batch_without_checkpointing()
              << " without checkpointing, "
              << prediction->max_batch_with_schedule()
              << " with a schedule (overhead <= "
              << absl::StrFormat("%.0f%%", 100 * prediction->max_overhead())
              << ")\n  " << prediction->reason()
              << "\n  not verified by execution: run a step at "
              << absl::StrJoin(prediction->verify_batch_sizes(), " and ")
              << " (mutwo-worker execute --baseline=false), or submit the "
                 "batch sizes with --capacity to have the service do it\n";
  }
  return kExitOk;
}

}  // namespace mutwo
