#include "worker/profile_command.h"

#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/flag_values.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "common/step_flag_help.h"
#include "worker/profile_format.h"
#include "worker/profiler.h"

ABSL_FLAG(std::string, input, "",
          "a model input NAME:DTYPE[DIMS]{LOW,HIGH} with B for the batch "
          "size, e.g. x:float32[B,3,224,224]; once per forward argument, in "
          "order");
ABSL_FLAG(std::string, unbatched, "", mutwo::kUnbatchedFlagHelp);
ABSL_FLAG(int64_t, batch, 0, "the batch size substituted for B (required)");
ABSL_FLAG(std::string, loss, "mean", mutwo::kLossFlagHelp);
ABSL_FLAG(std::string, optimizer, "sgd", mutwo::kOptimizerFlagHelp);
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(int32_t, warmup, 1, "warm-up iterations");
ABSL_FLAG(int32_t, iterations, 3, "measured iterations (the median is kept)");
ABSL_FLAG(std::string, output, "text",
          "text (a summary for people), json (the whole Profile, for "
          "scripts and `mutwo plan`) or csv");
ABSL_FLAG(std::string, memory_limit, "",
          "fail allocations beyond this size like an out-of-memory (e.g. "
          "2GiB; default: the device's memory)");
ABSL_FLAG(uint64_t, seed, 0, "seed of the generated inputs");
ABSL_FLAG(bool, specialize_control_flow, false,
          "plan inside control flow: record the branch each `if` takes on "
          "the generated inputs and build the graph of that branch, with a "
          "guard that fails the step if the other one is taken, and unroll "
          "loops of a constant trip count (<= 64); false: an `if` or loop "
          "is one opaque node. Profile and execute must agree (the graph "
          "fingerprint differs). Off by default until the GPU zoo passes "
          "with it: an H100 measured the zoo's Transformer encoder 8.7% "
          "over its floor budget");

namespace mutwo::worker {
namespace {

int Fail(const absl::Status& status) {
  return CommandFailure("profile", status);
}

}  // namespace

int CommandFailure(const std::string& command, const absl::Status& status) {
  std::cerr << "mutwo-worker " << command << ": "
            << absl::StrReplaceAll(status.message(), {{"\n", " "}}) << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ||
                 status.code() == absl::StatusCode::kNotFound
             ? kExitBadInput
             : kExitFailure;
}

absl::Status ReadStepFlags(const ParsedArgs& args,
                           TrainingStepOptions* options) {
  TrainingStepOptions& flags = *options;
  flags.inputs.clear();
  for (const std::string& text : args.Repeated("input")) {
    auto spec = ParseTensorSpec(text);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--input: ", spec.status().message()));
    }
    flags.inputs.push_back(*std::move(spec));
  }
  auto loss = ParseLossFlags(args.Repeated("loss"));
  if (!loss.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--loss: ", loss.status().message()));
  }
  flags.loss = *std::move(loss);
  // A spec without B stays the same at every batch size; refused here, not
  // deep in the model's forward.
  if (absl::Status s =
          CheckBatchDims(flags.inputs, &flags.loss, args.Repeated("unbatched"));
      !s.ok()) {
    return s;
  }
  auto optimizer = ParseOptimizerSpec(absl::GetFlag(FLAGS_optimizer));
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer: ", optimizer.status().message()));
  }
  flags.optimizer = *std::move(optimizer);
  flags.batch_size = absl::GetFlag(FLAGS_batch);
  flags.device = absl::AsciiStrToLower(absl::GetFlag(FLAGS_device));
  if (flags.device != "cpu" && flags.device != "cuda" &&
      !absl::StartsWith(flags.device, "cuda:")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device \"", absl::GetFlag(FLAGS_device),
                     "\": use cpu, cuda or cuda:N"));
  }
  if (absl::GetFlag(FLAGS_warmup) < 0 || absl::GetFlag(FLAGS_iterations) < 1) {
    return absl::InvalidArgumentError(
        "--warmup must be 0 or more and --iterations 1 or more");
  }
  flags.warmup_iterations = absl::GetFlag(FLAGS_warmup);
  flags.measure_iterations = absl::GetFlag(FLAGS_iterations);
  flags.seed = absl::GetFlag(FLAGS_seed);
  flags.specialize_control_flow = absl::GetFlag(FLAGS_specialize_control_flow);
  if (const std::string limit = absl::GetFlag(FLAGS_memory_limit);
      !limit.empty()) {
    auto bytes = ParseMemorySize("--memory_limit", limit);
    if (!bytes.ok()) return bytes.status();
    flags.memory_limit_bytes = *bytes;
  }
  return absl::OkStatus();
}

int RunProfileCommand(const ParsedArgs& args) {
  if (args.positional.size() != 1) {
    return Fail(absl::InvalidArgumentError(
        args.positional.empty()
            ? "expected the model file: mutwo-worker profile MODEL.pt "
              "--input ... --batch N"
            : absl::StrCat("expected one model file, got ",
                           args.positional.size(), " arguments")));
  }
  ProfilerOptions options;
  options.model_path = args.positional[0];
  if (absl::Status s = ReadStepFlags(args, &options); !s.ok()) return Fail(s);
  if (options.batch_size <= 0) {
    return Fail(absl::InvalidArgumentError(
        "--batch: a positive batch size is required"));
  }
  auto output = ParseChoice("--output", absl::GetFlag(FLAGS_output),
                            {"text", "json", "csv"});
  if (!output.ok()) return Fail(output.status());

  auto profiler = Profiler::Create(std::move(options));
  if (!profiler.ok()) return Fail(profiler.status());
  auto profile = (*profiler)->Run();
  if (!profile.ok()) return Fail(profile.status());
  if (*output == "json") {
    std::cout << ProtoToJson(*profile) << "\n";
  } else if (*output == "csv") {
    std::cout << FormatProfileCsv(*profile);
  } else {
    std::cout << FormatProfileText(*profile);
  }
  return kExitOk;
}

}  // namespace mutwo::worker
