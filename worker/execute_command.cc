#include "worker/execute_command.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/args.h"
#include "common/flag_values.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "common/status_macros.h"
#include "common/validation_check.h"
#include "worker/executor.h"
#include "worker/profile_command.h"
#include "worker/step_trace.h"

// Shared with `profile` (defined in profile_command.cc).
ABSL_DECLARE_FLAG(std::string, input);
ABSL_DECLARE_FLAG(int64_t, batch);
ABSL_DECLARE_FLAG(std::string, loss);
ABSL_DECLARE_FLAG(std::string, optimizer);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int32_t, warmup);
ABSL_DECLARE_FLAG(int32_t, iterations);
ABSL_DECLARE_FLAG(std::string, output);
ABSL_DECLARE_FLAG(std::string, memory_limit);
ABSL_DECLARE_FLAG(uint64_t, seed);

ABSL_FLAG(std::string, schedule, "",
          "the Schedule JSON (`mutwo plan ... --output json`)");
ABSL_FLAG(bool, baseline, true,
          "also run the unmodified step and compare gradients, loss "
          "and batch-norm statistics with it; --baseline=false runs only the "
          "scheduled step (batch sizes where only a schedule fits)");
ABSL_FLAG(std::string, trace_dir, "",
          "after the timed steps, write a Chrome trace (PyTorch profiler) of "
          "one unmodified step (unmodified.json) and one scheduled step "
          "(scheduled.json) into this folder: ops, kernels and the "
          "executor's replays and swaps (bench/executor/trace_summary.py "
          "summarises them). Needs a LibTorch with the Kineto profiler");
ABSL_FLAG(bool, force, false,
          "run a schedule the planner marked infeasible "
          "(\"feasible\": false) instead of refusing it with exit code 3");

namespace mutwo::worker {
namespace {

int Fail(const absl::Status& status) {
  return CommandFailure("execute", status);
}

// Why the planner marked `schedule` infeasible, naming the budget and the
// floor.
std::string InfeasibleMessage(const v1::Schedule& schedule) {
  const std::string budget = FormatBytes(schedule.budget_bytes());
  const std::string floor = FormatBytes(schedule.floor_bytes());
  if (schedule.budget_bytes() < schedule.floor_bytes()) {
    return absl::StrCat("infeasible: the budget ", budget,
                        " is below the floor ", floor,
                        " (the lowest budget the planner fits)");
  }
  // Above the floor: infeasible for another reason (mutwo-server's closed
  // loop marks schedules that measured over their budget).
  return absl::StrCat("infeasible for the budget ", budget, " (floor ", floor,
                      ")", schedule.reason().empty() ? "" : ": ",
                      absl::StrReplaceAll(schedule.reason(), {{"\n", " "}}));
}

// One part of the planned step: `planned` when the flag is not given;
// a given value that differs is refused, naming both (a peak measured for
// another step says nothing about the planned one).
template <typename Spec, typename Format>
absl::Status UsePlanned(absl::string_view flag, bool given, const Spec& planned,
                        Format format, Spec* mine) {
  if (!given) {
    *mine = planned;
  } else if (format(*mine) != format(planned)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", format(*mine), " contradicts the schedule, planned for ",
        flag, " ", format(planned)));
  }
  return absl::OkStatus();
}

// The step `schedule` was planned for (its inputs, loss and optimizer),
// where the flags leave it open; schedules that do not record it leave the
// flags as given.
absl::Status UseScheduleStep(const v1::Schedule& schedule,
                             const ParsedArgs& args,
                             TrainingStepOptions* options) {
  auto inputs_text = [](const std::vector<v1::TensorSpec>& specs) {
    std::vector<std::string> texts;
    for (const v1::TensorSpec& spec : specs) {
      texts.push_back(FormatTensorSpec(spec));
    }
    std::sort(texts.begin(), texts.end());
    return absl::StrJoin(texts, " ");
  };
  if (!schedule.inputs().empty()) {
    MUTWO_RETURN_IF_ERROR(
        UsePlanned("--input", args.Given("input"),
                   std::vector<v1::TensorSpec>(schedule.inputs().begin(),
                                               schedule.inputs().end()),
                   inputs_text, &options->inputs));
  }
  if (schedule.has_loss()) {
    MUTWO_RETURN_IF_ERROR(UsePlanned("--loss", args.Given("loss"),
                                     schedule.loss(), FormatLossSpec,
                                     &options->loss));
  }
  if (schedule.has_optimizer()) {
    MUTWO_RETURN_IF_ERROR(UsePlanned("--optimizer", args.Given("optimizer"),
                                     schedule.optimizer(), FormatOptimizerSpec,
                                     &options->optimizer));
  }
  return absl::OkStatus();
}

}  // namespace

std::string FormatValidationText(const v1::Validation& v) {
  const double planned_baseline_ms = v.predicted_baseline().iteration_ms();
  std::string out;
  absl::StrAppendFormat(&out, "device          %s (%s)\n", v.device().name(),
                        v.device().kind());
  absl::StrAppendFormat(&out, "batch size      %d\n", v.batch_size());
  absl::StrAppendFormat(&out, "decisions       %d recomputed, %d swapped\n",
                        v.recomputed(), v.swapped());
  if (v.oom()) absl::StrAppendFormat(&out, "OUT OF MEMORY   %s\n", v.error());
  absl::StrAppendFormat(&out, "%-15s %14s %12s\n", "", "peak", "iteration");
  auto row = [&](const char* name, const v1::StepStats& s) {
    absl::StrAppendFormat(&out, "%-15s %14s %10.1f ms\n", name,
                          FormatBytes(s.peak_bytes()), s.iteration_ms());
  };
  // --baseline=false ran no unmodified step: no row of zeros for it.
  if (!v.baseline_skipped()) row("baseline", v.baseline());
  row("scheduled", v.scheduled());
  row("predicted", v.predicted());
  // The predicted time is the profile's baseline plus what the plan adds;
  // beside another run's baseline it reads as an overhead it is not.
  const bool other_baseline =
      planned_baseline_ms > 0 &&
      (v.baseline_skipped() ||
       absl::StrFormat("%.1f", planned_baseline_ms) !=
           absl::StrFormat("%.1f", v.baseline().iteration_ms()));
  const double predicted_overhead =
      planned_baseline_ms > 0
          ? 100.0 * (v.predicted().iteration_ms() / planned_baseline_ms - 1)
          : 0.0;
  if (other_baseline) {
    absl::StrAppendFormat(
        &out,
        "                predicted from the profile's baseline step, "
        "%.1f ms (%+.1f%%)%s\n",
        planned_baseline_ms, predicted_overhead,
        v.baseline_skipped()
            ? ""
            : absl::StrFormat("; this run's baseline took %.1f ms",
                              v.baseline().iteration_ms()));
  }
  absl::StrAppendFormat(&out, "budget          %s (%s)\n",
                        FormatBytes(v.budget_bytes()),
                        v.within_budget() ? "within" : "EXCEEDED");
  if (!v.baseline_skipped() && v.baseline().peak_bytes() > 0) {
    absl::StrAppendFormat(
        &out, "memory saved    %s (%.1f%%), time paid %+.1f%%%s\n",
        FormatBytes(v.baseline().peak_bytes() - v.scheduled().peak_bytes()),
        100.0 * (v.baseline().peak_bytes() - v.scheduled().peak_bytes()) /
            v.baseline().peak_bytes(),
        v.baseline().iteration_ms() > 0
            ? 100.0 *
                  (v.scheduled().iteration_ms() / v.baseline().iteration_ms() -
                   1)
            : 0.0,
        planned_baseline_ms > 0
            ? absl::StrFormat(" (predicted %+.1f%%)", predicted_overhead)
            : "");
  }
  if (v.baseline_skipped()) {
    absl::StrAppendFormat(&out,
                          "gradients       not compared (--baseline=false)\n");
    return out;
  }
  absl::StrAppendFormat(&out,
                        "gradients       %s (max |diff| %g), loss diff %g, "
                        "batch-norm statistics %s\n",
                        v.gradients_match() ? "match" : "DIFFER",
                        v.max_abs_grad_diff(), v.loss_diff(),
                        v.batchnorm_stats_match() ? "match" : "DIFFER");
  return out;
}

int RunExecuteCommand(const ParsedArgs& args) {
  if (args.positional.size() != 1) {
    return Fail(absl::InvalidArgumentError(
        args.positional.empty()
            ? "expected the model file: mutwo-worker execute MODEL.pt "
              "--schedule SCHEDULE.json --input ... --batch N"
            : absl::StrCat("expected one model file, got ",
                           args.positional.size(), " arguments")));
  }
  const std::string schedule_path = absl::GetFlag(FLAGS_schedule);
  if (schedule_path.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--schedule: the schedule JSON file is required"));
  }
  v1::Schedule schedule;
  if (absl::Status s = ReadProtoJsonFile(schedule_path, &schedule); !s.ok()) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("--schedule: ", s.message())));
  }
  ExecutorOptions options;
  options.model_path = args.positional[0];
  if (absl::Status s = ReadStepFlags(args, &options); !s.ok()) return Fail(s);
  if (absl::Status s = UseScheduleStep(schedule, args, &options); !s.ok()) {
    return Fail(s);
  }
  // Without --batch, the schedule's batch size.
  if (options.batch_size <= 0) options.batch_size = schedule.batch_size();
  if (options.batch_size <= 0) {
    return Fail(absl::InvalidArgumentError(
        "--batch: a positive batch size is required"));
  }
  options.run_baseline = absl::GetFlag(FLAGS_baseline);
  options.trace_dir = absl::GetFlag(FLAGS_trace_dir);
  if (!options.trace_dir.empty()) {
    // Before the model loads: a build without the profiler fails now, not
    // after the timed steps.
    if (absl::Status s = ProbeStepTrace(options.trace_dir); !s.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--trace_dir ", options.trace_dir, ": ", s.message())));
    }
  }
  auto output =
      ParseChoice("--output", absl::GetFlag(FLAGS_output), {"text", "json"});
  if (!output.ok()) return Fail(output.status());
  if (!schedule.feasible() && !absl::GetFlag(FLAGS_force)) {
    std::cerr << "mutwo-worker execute: " << schedule_path << " is "
              << InfeasibleMessage(schedule)
              << "; nothing run, --force runs it anyway\n";
    return kExitInfeasible;
  }
  auto executor = Executor::Create(std::move(options));
  if (!executor.ok()) return Fail(executor.status());
  auto validation = (*executor)->Run(schedule);
  if (!validation.ok()) return Fail(validation.status());
  if (*output == "json") {
    std::cout << ProtoToJson(*validation) << "\n";
  } else {
    std::cout << FormatValidationText(*validation);
  }
  // The result is printed either way; the exit code says whether it proves
  // the schedule, so that scripts cannot take an over-budget run for a fit.
  const ValidationCheck check = CheckValidation(*validation);
  if (!check.ok()) {
    std::cerr << "mutwo-worker execute: " << check.problem << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace mutwo::worker
