// ForeachOptimizer updates parameters as LibTorch's optimizers do, over
// several steps, chunks of mixed shapes and parameters without a gradient;
// its temporaries per chunk, or of all parameters with `all_at_once`.
#include "worker/foreach_optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "worker/memory.h"

namespace mutwo::worker {
namespace {

// Parameters of mixed sizes: chunks hold at most the largest parameter's
// bytes, so boundaries fall inside the list.
std::vector<torch::Tensor> MakeParameters() {
  torch::manual_seed(3);
  std::vector<torch::Tensor> out;
  const std::vector<int64_t> sizes = {7, 64 * 33, 1, 5000, 3, 900, 4100};
  for (int64_t n : sizes) {
    out.push_back(torch::randn({n}).requires_grad_());
  }
  return out;
}

// Runs `steps` updates with the same gradients on two copies of the
// parameters; the gradient of the third parameter is missing at step 1.
void ExpectSameUpdates(torch::optim::Optimizer& reference,
                       std::vector<torch::Tensor>& ref_params,
                       ForeachOptimizer& foreach_opt,
                       std::vector<torch::Tensor>& params, int steps) {
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (step == 1 && i == 2) {
        params[i].mutable_grad() = torch::Tensor();
        ref_params[i].mutable_grad() = torch::Tensor();
        continue;
      }
      torch::Tensor g = torch::randn_like(params[i]);
      params[i].mutable_grad() = g.clone();
      ref_params[i].mutable_grad() = g.clone();
    }
    reference.step();
    foreach_opt.step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i], ref_params[i], 1e-6, 1e-7))
        << "parameter " << i << " differs by "
        << (params[i] - ref_params[i]).abs().max().item<double>();
  }
}

std::vector<torch::Tensor> Copy(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params) {
    out.push_back(p.detach().clone().requires_grad_());
  }
  return out;
}

TEST(ForeachOptimizerTest, SgdWithWeightDecayMatchesLibTorch) {
  std::vector<torch::Tensor> params = MakeParameters();
  std::vector<torch::Tensor> ref = Copy(params);
  torch::optim::SGD reference(ref,
                              torch::optim::SGDOptions(0.1).weight_decay(0.01));
  ForeachOptimizer opt(
      params,
      {.kind = ForeachOptions::Kind::kSgd, .lr = 0.1, .weight_decay = 0.01});
  ExpectSameUpdates(reference, ref, opt, params, 3);
}

TEST(ForeachOptimizerTest, SgdMomentumMatchesLibTorch) {
  std::vector<torch::Tensor> params = MakeParameters();
  std::vector<torch::Tensor> ref = Copy(params);
  torch::optim::SGD reference(
      ref, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.001));
  ForeachOptimizer opt(params, {.kind = ForeachOptions::Kind::kSgd,
                                .lr = 0.05,
                                .momentum = 0.9,
                                .weight_decay = 0.001});
  ExpectSameUpdates(reference, ref, opt, params, 4);
}

TEST(ForeachOptimizerTest, AdamMatchesLibTorch) {
  std::vector<torch::Tensor> params = MakeParameters();
  std::vector<torch::Tensor> ref = Copy(params);
  torch::optim::Adam reference(
      ref, torch::optim::AdamOptions(1e-2).weight_decay(0.01));
  ForeachOptimizer opt(
      params,
      {.kind = ForeachOptions::Kind::kAdam, .lr = 1e-2, .weight_decay = 0.01});
  ExpectSameUpdates(reference, ref, opt, params, 4);
}

TEST(ForeachOptimizerTest, AdamWMatchesLibTorch) {
  std::vector<torch::Tensor> params = MakeParameters();
  std::vector<torch::Tensor> ref = Copy(params);
  torch::optim::AdamW reference(
      ref, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
  ForeachOptimizer opt(
      params,
      {.kind = ForeachOptions::Kind::kAdamW, .lr = 1e-2, .weight_decay = 0.05});
  ExpectSameUpdates(reference, ref, opt, params, 4);
}

// The update's temporaries: chunks of at most the largest parameter hold
// one largest parameter's denominators; `all_at_once` holds all of them
// (torch.optim's foreach implementation), and updates the same.
TEST(ForeachOptimizerTest, AllAtOnceHoldsTemporariesOfAllParameters) {
  auto backend = CreateDeviceBackend("cpu", 0);  // the counting allocator
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::vector<torch::Tensor> base = MakeParameters();
  int64_t all = 0, largest = 0;
  for (const torch::Tensor& p : base) {
    all += static_cast<int64_t>(p.nbytes());
    largest = std::max(largest, static_cast<int64_t>(p.nbytes()));
  }
  auto peak_of_second_step = [&](bool all_at_once,
                                 std::vector<torch::Tensor>& params) {
    ForeachOptimizer opt(params, {.kind = ForeachOptions::Kind::kAdam,
                                  .lr = 1e-2,
                                  .all_at_once = all_at_once});
    torch::manual_seed(9);
    for (torch::Tensor& p : params) p.mutable_grad() = torch::randn_like(p);
    opt.step();  // the states are made here
    (*backend)->ResetPeak();
    const int64_t before = (*backend)->AllocatedBytes();
    opt.step();
    return (*backend)->PeakBytes() - before;
  };
  std::vector<torch::Tensor> chunked = Copy(base), whole = Copy(base);
  const int64_t chunked_peak = peak_of_second_step(false, chunked);
  const int64_t whole_peak = peak_of_second_step(true, whole);
  EXPECT_LE(chunked_peak, largest + 4096) << "largest " << largest;
  EXPECT_GE(whole_peak, all) << "all " << all;
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_TRUE(torch::allclose(chunked[i], whole[i], 1e-6, 1e-7)) << i;
  }
}

// A tied weight listed twice (under the embedding's and the head's names)
// is updated once and has one state, as Python's optimizers treat it.
TEST(ForeachOptimizerTest, ATiedWeightListedTwiceIsUpdatedOnce) {
  torch::manual_seed(5);
  torch::Tensor tied = torch::randn({16}).requires_grad_();
  torch::Tensor ref = tied.detach().clone().requires_grad_();
  ForeachOptimizer opt({tied, tied},
                       {.kind = ForeachOptions::Kind::kAdam, .lr = 1e-2});
  torch::optim::Adam reference({ref}, torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    torch::Tensor g = torch::randn_like(tied);
    tied.mutable_grad() = g.clone();
    ref.mutable_grad() = g.clone();
    opt.step();
    reference.step();
  }
  EXPECT_TRUE(torch::allclose(tied, ref, 1e-6, 1e-7))
      << (tied - ref).abs().max().item<double>();
}

}  // namespace
}  // namespace mutwo::worker
