// Trains a TorchScript model for a few steps in a loop of its own (its data,
// its loss, its optimizer) with a mutwo schedule applied, beside the same
// loop without the schedule, and checks that every step's loss and
// gradients are equal.
//
//   train MODEL.pt SCHEDULE.json [STEPS]
//
// MODEL.pt takes one float input [B, C, H, W] and returns logits [B, K];
// SCHEDULE.json is `mutwo plan ... --output json` (or `mutwo schedule`) for
// it. Exit 0 when every step matched, 1 otherwise, 2 for bad arguments.
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "mutwo/scheduled_step.h"

namespace {

std::vector<torch::Tensor> Parameters(const torch::jit::Module& m) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : m.parameters()) out.push_back(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: train MODEL.pt SCHEDULE.json [STEPS]\n";
    return 2;
  }
  const int steps = argc > 3 ? std::atoi(argv[3]) : 3;
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    torch::jit::Module plain = torch::jit::load(argv[1]);  // same weights
    model.train();
    plain.train();
    mutwo::ScheduledStep step(model, mutwo::ReadScheduleFile(argv[2]));
    std::cout << "schedule: " << step.recomputed() << " recomputed, "
              << step.swapped() << " swapped\n";

    torch::optim::AdamW scheduled_opt(Parameters(model),
                                      torch::optim::AdamWOptions(1e-3));
    torch::optim::AdamW plain_opt(Parameters(plain),
                                  torch::optim::AdamWOptions(1e-3));
    // A synthetic data set: 4 batches of 4 images, 10 classes.
    torch::manual_seed(0);
    std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
    for (int i = 0; i < 4; ++i) {
      data.emplace_back(torch::randn({4, 3, 16, 16}),
                        torch::randint(0, 10, {4}));
    }
    double worst = 0;
    bool ok = true;
    for (int s = 0; s < steps; ++s) {
      const auto& [x, y] = data[s % data.size()];
      auto loss_fn = [&y](const torch::IValue& out) {
        return torch::nn::functional::cross_entropy(out.toTensor(), y);
      };
      scheduled_opt.zero_grad();
      torch::manual_seed(100 + s);  // dropout draws the same masks
      const torch::Tensor loss = step.Run({x}, loss_fn);

      plain_opt.zero_grad();
      torch::manual_seed(100 + s);
      const torch::Tensor plain_loss = loss_fn(plain.forward({x}));
      plain_loss.backward();

      double diff = 0;
      const auto a = Parameters(model), b = Parameters(plain);
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].grad().defined() || !b[i].grad().defined()) {
          ok = ok && a[i].grad().defined() == b[i].grad().defined();
          continue;
        }
        diff = std::max(diff,
                        (a[i].grad() - b[i].grad()).abs().max().item<double>());
      }
      const double loss_diff =
          std::abs(loss.item<double>() - plain_loss.item<double>());
      worst = std::max(worst, diff);
      std::cout << "step " << s << ": loss " << loss.item<double>()
                << " (plain " << plain_loss.item<double>()
                << "), max gradient difference " << diff << "\n";
      ok = ok && diff <= 1e-5 && loss_diff <= 1e-6;
      scheduled_opt.step();
      plain_opt.step();
    }
    std::cout << (ok ? "gradients equal" : "GRADIENTS DIFFER") << " (worst "
              << worst << ")\n";
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
