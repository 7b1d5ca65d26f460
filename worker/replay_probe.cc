#include "worker/replay_probe.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "worker/autograd_hooks.h"
#include "worker/swap.h"

namespace mutwo::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A one-op segment, run as the executor runs one (SegmentFunction in
// checkpoint.cc): forward without autograd, then in backward the RNG state
// put back, the op run again with autograd on from a detached input, and a
// nested backward through it.
struct ProbeSegment : public torch::autograd::Function<ProbeSegment> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x) {
    ctx->saved_data["x"] = x.detach();
    torch::NoGradGuard no_grad;
    return {x.mul(2)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor x = ctx->saved_data["x"].toTensor();
    const torch::Device device = x.device();
    const std::string cpu_now = SaveCpuRng();
    const torch::Tensor device_now = SaveDeviceRng(device);
    RestoreCpuRng(cpu_now);
    RestoreDeviceRng(device, device_now);
    torch::Tensor leaf = x.detach().requires_grad_(true);
    torch::Tensor y;
    {
      torch::AutoGradMode grad_mode(true);
      y = leaf.mul(2);
    }
    RestoreCpuRng(cpu_now);
    RestoreDeviceRng(device, device_now);
    torch::autograd::edge_list roots{torch::autograd::impl::gradient_edge(y)};
    torch::autograd::edge_list wrt{torch::autograd::Edge(
        torch::autograd::impl::grad_accumulator(leaf), 0)};
    variable_list out = torch::autograd::Engine::get_default_engine().execute(
        roots, {grads[0]}, /*keep_graph=*/false, /*create_graph=*/false,
        /*accumulate_grad=*/false, wrt);
    return {out[0]};
  }
};

}  // namespace

double MeasureReplayOverheadMs(const torch::Device& device,
                               const std::function<void()>& synchronize,
                               int rounds, int per_round) {
  const torch::Tensor x = torch::ones(
      {1}, torch::TensorOptions().device(device).requires_grad(true));
  // Per step: the probe runs the op once more than the plain step does
  // (without autograd); that run is the replay's op, not its overhead.
  auto plain = [&]() {
    torch::Tensor y = x.mul(2);
    y.sum().backward();
    torch::NoGradGuard no_grad;
    (void)x.mul(2);
  };
  auto probe = [&]() {
    torch::Tensor y = ProbeSegment::apply(x)[0];
    y.sum().backward();
  };
  auto time_ms = [&](const std::function<void()>& step) {
    synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < per_round; ++i) step();
    synchronize();
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - start)
        .count();
  };
  // Warm-up: first calls allocate and initialise.
  time_ms(plain);
  time_ms(probe);
  std::vector<double> per_replay;
  for (int r = 0; r < rounds; ++r) {
    const double base = time_ms(plain);
    const double with = time_ms(probe);
    per_replay.push_back(std::max(0.0, (with - base) / per_round));
  }
  return Median(per_replay);
}

}  // namespace mutwo::worker
