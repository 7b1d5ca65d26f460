// mutwo::ScheduledStep in a LibTorch loop of its own (the C++ user's path),
// beside the same loop without the schedule, on one device in one process:
//
//   scheduled_step_bench MODEL.pt SCHEDULE.json --input=SPEC [--input=...]
//       [--loss=cross_entropy:y:int64[B]{0,1000}] [--optimizer=adam]
//       [--device=cuda:0] [--iterations=5]
//
// The unmodified loop first (module.forward, the loss, backward, the
// optimizer): its gradients after one step (seed 0) are the reference, then
// two more warm-up steps and --iterations timed steps. Then the same with
// ScheduledStep::Run on a fresh copy of the module. Peak: the device
// backend's high-water mark over the timed steps (on CUDA the caching
// allocator's allocated bytes, the worker's measure) after a reset
// following the warm-up; time: the median step, synchronized. Prints one
// JSON object; exit 0 when the gradients are equal and the scheduled peak
// is within the schedule's budget, 1 otherwise, 2 for bad arguments.
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/parse.h"
#include "common/proto_io.h"
#include "mutwo/scheduled_step.h"
#include "mutwo/v1/types.pb.h"
#include "worker/inputs.h"
#include "worker/memory.h"

namespace mutwo {
namespace {

struct Args {
  std::string model, schedule;
  std::vector<v1::TensorSpec> inputs;
  v1::LossSpec loss;
  v1::OptimizerSpec optimizer;
  std::string device = "cpu";
  int iterations = 5;
};

struct Measured {
  int64_t peak_bytes = 0;
  double iteration_ms = 0;
  // After the first step, copied out of the device's allocator (on the CPU
  // a tensor kept here would count in the next loop's peak); empty for a
  // parameter without a gradient.
  std::vector<std::vector<float>> grads;
  std::vector<bool> has_grad;
  double loss = 0;
};

int Usage(const std::string& why) {
  std::cerr << "scheduled_step_bench: " << why
            << "\nusage: scheduled_step_bench MODEL.pt SCHEDULE.json "
               "--input=SPEC [...] [--loss=SPEC] [--optimizer=SPEC] "
               "[--device=cuda:0] [--iterations=5]\n";
  return 2;
}

std::vector<torch::Tensor> Parameters(const torch::jit::Module& m) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : m.parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    throw std::runtime_error(absl::StrCat(what, ": ", v.status().message()));
  }
  return *std::move(v);
}

// One loop: `step(inputs, loss)` runs forward + loss + backward.
Measured Loop(const Args& args, const v1::Schedule& schedule,
              worker::DeviceBackend& backend, bool scheduled) {
  const torch::Device device(args.device);
  torch::jit::Module model = torch::jit::load(args.model);
  model.to(device);
  model.train();
  std::unique_ptr<ScheduledStep> step;
  if (scheduled) {
    ScheduledStepOptions options;
    options.device = args.device;
    step = std::make_unique<ScheduledStep>(
        model, ScheduleJson{ProtoToJson(schedule)}, options);
  }
  const int64_t batch = schedule.batch_size();
  const std::vector<torch::Tensor> xs =
      Check(worker::MakeInputs(args.inputs, batch, device, 0), "inputs");
  const std::vector<torch::Tensor> targets =
      Check(worker::MakeTargets(args.loss, batch, device), "targets");
  std::vector<torch::IValue> inputs(xs.begin(), xs.end());
  auto loss_of = [&](const torch::IValue& out) {
    return Check(worker::ComputeLoss(args.loss, out, targets), "loss");
  };
  auto once = [&]() -> torch::Tensor {
    if (step != nullptr) return step->Run(inputs, loss_of);
    torch::Tensor loss = loss_of(model.forward(inputs));
    loss.backward();
    return loss.detach();
  };
  std::unique_ptr<torch::optim::Optimizer> optimizer = Check(
      worker::MakeOptimizer(args.optimizer, Parameters(model)), "optimizer");
  auto zero = [&] {
    for (torch::Tensor p : Parameters(model))
      p.mutable_grad() = torch::Tensor();
  };
  Measured m;
  torch::manual_seed(0);
  zero();
  m.loss = once().item<double>();
  for (const torch::Tensor& p : Parameters(model)) {
    m.has_grad.push_back(p.grad().defined());
    std::vector<float>& out = m.grads.emplace_back();
    if (!p.grad().defined()) continue;
    const torch::Tensor g =
        p.grad().to(torch::kCPU, torch::kFloat).contiguous();
    out.assign(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  }
  if (optimizer) optimizer->step();  // the optimizer state exists
  // Two more warm-up steps: TorchScript's profiling executor optimizes a
  // module's forward over its first runs.
  for (int i = 0; i < 2; ++i) {
    zero();
    once();
    if (optimizer) optimizer->step();
  }
  std::vector<double> ms;
  for (int i = 0; i < args.iterations; ++i) {
    // As the worker measures a step (TrainingState::TimedSteps): the
    // high-water mark from the step's start, gradients released.
    zero();
    backend.Synchronize();
    backend.ResetPeak();
    const auto t0 = std::chrono::steady_clock::now();
    once();
    if (optimizer) optimizer->step();
    backend.Synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - t0)
                     .count());
    m.peak_bytes = std::max(m.peak_bytes, backend.PeakBytes());
  }
  std::sort(ms.begin(), ms.end());
  m.iteration_ms = ms[ms.size() / 2];
  return m;
}

int Run(int argc, char** argv) {
  Args args;
  std::vector<std::string> positional;
  args.loss.set_kind(v1::LossSpec::MEAN);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const std::string prefix = absl::StrCat(flag, "=");
      return absl::StartsWith(a, prefix) ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("--input")) {
      auto spec = ParseTensorSpec(v);
      if (!spec.ok()) return Usage(std::string(spec.status().message()));
      args.inputs.push_back(*spec);
    } else if (const char* v = value("--loss")) {
      auto loss = ParseLossSpec(v);
      if (!loss.ok()) return Usage(std::string(loss.status().message()));
      args.loss = *loss;
    } else if (const char* v = value("--optimizer")) {
      auto opt = ParseOptimizerSpec(v);
      if (!opt.ok()) return Usage(std::string(opt.status().message()));
      args.optimizer = *opt;
    } else if (const char* v = value("--device")) {
      args.device = v;
    } else if (const char* v = value("--iterations")) {
      if (!absl::SimpleAtoi(v, &args.iterations) || args.iterations < 1) {
        return Usage(absl::StrCat("--iterations=", v, ": a positive count"));
      }
    } else if (absl::StartsWith(a, "--")) {
      return Usage(absl::StrCat("unknown flag ", a));
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) return Usage("MODEL.pt and SCHEDULE.json");
  if (args.inputs.empty()) return Usage("--input: at least one");
  args.model = positional[0];
  args.schedule = positional[1];
  v1::Schedule schedule;
  if (absl::Status s = ReadProtoJsonFile(args.schedule, &schedule); !s.ok()) {
    return Usage(std::string(s.message()));
  }
  auto backend = worker::CreateDeviceBackend(args.device, 0);
  if (!backend.ok()) return Usage(std::string(backend.status().message()));
  try {
    const Measured plain = Loop(args, schedule, **backend, false);
    const Measured sched = Loop(args, schedule, **backend, true);
    double scale = 0, diff = 0;
    bool same = plain.grads.size() == sched.grads.size() &&
                plain.has_grad == sched.has_grad;
    for (size_t i = 0; same && i < plain.grads.size(); ++i) {
      const std::vector<float>& a = plain.grads[i];
      const std::vector<float>& b = sched.grads[i];
      if (a.size() != b.size()) {
        same = false;
        break;
      }
      for (size_t k = 0; k < a.size(); ++k) {
        scale = std::max(scale, static_cast<double>(std::abs(a[k])));
        // Written so that a NaN difference counts as differing.
        const double d = std::abs(static_cast<double>(a[k]) - b[k]);
        diff = std::isnan(d) ? d : std::max(diff, d);
      }
    }
    // The worker's rule: max |diff| <= 1e-6 + 1e-5 x the largest gradient
    // (client/python/mutwo/_verify.py; TF32 is off in LibTorch by default
    // for convolutions only where the caller sets it).
    const bool grads_equal = same && diff <= 1e-6 + 1e-5 * scale;
    const bool within = sched.peak_bytes <= schedule.budget_bytes();
    std::printf(
        "{\"model\": \"%s\", \"schedule\": \"%s\", \"device\": \"%s\", "
        "\"batch\": %lld, \"budget_bytes\": %lld, \"recomputed\": %d, "
        "\"swapped\": %d, \"predicted_peak_bytes\": %lld, "
        "\"predicted_iteration_ms\": %.3f, \"baseline_peak_bytes\": %lld, "
        "\"baseline_iteration_ms\": %.3f, \"scheduled_peak_bytes\": %lld, "
        "\"scheduled_iteration_ms\": %.3f, \"max_abs_grad_diff\": %g, "
        "\"largest_gradient\": %g, \"gradients_equal\": %s, "
        "\"within_budget\": %s, \"loss_diff\": %g}\n",
        args.model.c_str(), args.schedule.c_str(),
        (*backend)->Describe().name().c_str(),
        static_cast<long long>(schedule.batch_size()),
        static_cast<long long>(schedule.budget_bytes()),
        static_cast<int>(std::count_if(
            schedule.decisions().begin(), schedule.decisions().end(),
            [](const v1::Decision& d) {
              return d.action() == v1::Decision::RECOMPUTE;
            })),
        static_cast<int>(std::count_if(
            schedule.decisions().begin(), schedule.decisions().end(),
            [](const v1::Decision& d) {
              return d.action() == v1::Decision::SWAP;
            })),
        static_cast<long long>(schedule.predicted_peak_bytes()),
        schedule.predicted_iteration_ms(),
        static_cast<long long>(plain.peak_bytes), plain.iteration_ms,
        static_cast<long long>(sched.peak_bytes), sched.iteration_ms, diff,
        scale, grads_equal ? "true" : "false", within ? "true" : "false",
        std::abs(plain.loss - sched.loss));
    return grads_equal && within ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "scheduled_step_bench: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace
}  // namespace mutwo

int main(int argc, char** argv) { return mutwo::Run(argc, argv); }
