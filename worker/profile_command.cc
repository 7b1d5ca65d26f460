#include "worker/profile_command.h"

#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "worker/profile_format.h"
#include "worker/profiler.h"

ABSL_FLAG(std::string, input, "",
          "profile: a model input NAME:DTYPE[DIMS]{LOW,HIGH}, B = batch size "
          "(repeat once per forward argument)");
ABSL_FLAG(int64_t, batch, 0, "profile: batch size substituted for B");
ABSL_FLAG(std::string, loss, "mean",
          "profile: mean, sum, model or cross_entropy:TARGET_SPEC");
ABSL_FLAG(std::string, optimizer, "sgd",
          "profile: none, sgd, sgd_momentum, adam, adamw[:lr=...]");
ABSL_FLAG(std::string, device, "cpu", "profile: cpu, cuda or cuda:N");
ABSL_FLAG(int32_t, warmup, 1, "profile: warm-up iterations");
ABSL_FLAG(int32_t, iterations, 3, "profile: measured iterations (median)");
ABSL_FLAG(std::string, output, "json", "profile: json, csv or text");
ABSL_FLAG(std::string, memory_limit, "",
          "profile: fail allocations beyond this size like an out-of-memory "
          "(e.g. 2GiB); empty = the device's memory");
ABSL_FLAG(uint64_t, seed, 0, "profile: seed of the generated inputs");

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
  auto loss = ParseLossSpec(absl::GetFlag(FLAGS_loss));
  if (!loss.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--loss: ", loss.status().message()));
  }
  flags.loss = *std::move(loss);
  auto optimizer = ParseOptimizerSpec(absl::GetFlag(FLAGS_optimizer));
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer: ", optimizer.status().message()));
  }
  flags.optimizer = *std::move(optimizer);
  flags.batch_size = absl::GetFlag(FLAGS_batch);
  flags.device = absl::GetFlag(FLAGS_device);
  flags.warmup_iterations = absl::GetFlag(FLAGS_warmup);
  flags.measure_iterations = absl::GetFlag(FLAGS_iterations);
  flags.seed = absl::GetFlag(FLAGS_seed);
  if (const std::string limit = absl::GetFlag(FLAGS_memory_limit);
      !limit.empty()) {
    auto bytes = ParseBytes(limit);
    if (!bytes.ok() || *bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--memory_limit: expected a positive size like 2GiB, got \"", limit,
          "\""));
    }
    flags.memory_limit_bytes = *bytes;
  }
  return absl::OkStatus();
}

const char kProfileUsage[] =
    "  profile   MODEL.pt --input NAME:DTYPE[DIMS]{lo,hi} [--input ...] "
    "--batch N\n"
    "            [--loss mean|sum|model|cross_entropy:SPEC] [--optimizer "
    "sgd|sgd_momentum|adam|adamw|none]\n"
    "            [--device cpu|cuda:0] [--warmup 1] [--iterations 3] "
    "[--output json|csv|text]\n"
    "            profiles one training step (per-node time and memory, "
    "activations)\n";

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
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "json" && output != "csv" && output != "text") {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--output: expected json, csv or text, got \"", output, "\"")));
  }

  auto profiler = Profiler::Create(std::move(options));
  if (!profiler.ok()) return Fail(profiler.status());
  auto profile = (*profiler)->Run();
  if (!profile.ok()) return Fail(profile.status());
  if (output == "json") {
    std::cout << ProtoToJson(*profile) << "\n";
  } else if (output == "csv") {
    std::cout << FormatProfileCsv(*profile);
  } else {
    std::cout << FormatProfileText(*profile);
  }
  return kExitOk;
}

}  // namespace mutwo::worker
