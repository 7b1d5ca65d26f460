#include "worker/foreach_optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

namespace mutwo::worker {
namespace {

std::unique_ptr<torch::optim::OptimizerOptions> DefaultsOf(
    const ForeachOptions& o) {
  if (o.kind == ForeachOptions::Kind::kSgd) {
    return std::make_unique<torch::optim::SGDOptions>(
        torch::optim::SGDOptions(o.lr)
            .momentum(o.momentum)
            .weight_decay(o.weight_decay));
  }
  return std::make_unique<torch::optim::AdamOptions>(
      torch::optim::AdamOptions(o.lr).weight_decay(o.weight_decay));
}

std::vector<torch::Tensor> Pick(const std::vector<torch::Tensor>& all,
                                const std::vector<size_t>& members) {
  std::vector<torch::Tensor> out;
  out.reserve(members.size());
  for (size_t i : members) out.push_back(all[i]);
  return out;
}

}  // namespace

namespace {

// Each tensor once: a tied weight (a GPT's embedding and head) is listed
// under both modules' names; it gets one state and one update per step, as
// in Python, where module.parameters() lists it once.
std::vector<torch::Tensor> Distinct(const std::vector<torch::Tensor>& all) {
  std::vector<torch::Tensor> out;
  std::set<const c10::TensorImpl*> seen;
  for (const torch::Tensor& p : all) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

}  // namespace

ForeachOptimizer::ForeachOptimizer(const std::vector<torch::Tensor>& parameters,
                                   const ForeachOptions& options)
    : torch::optim::Optimizer(Distinct(parameters), DefaultsOf(options)),
      options_(options),
      params_(param_groups().front().params()),
      momentum_(params_.size()),
      exp_avg_(params_.size()),
      exp_avg_sq_(params_.size()),
      steps_(params_.size(), 0) {
  // Chunks of one device and dtype, in parameter order, of at most the
  // largest parameter's bytes (all_at_once: all of them).
  int64_t chunk_bytes = 0;
  for (const torch::Tensor& p : params_) {
    chunk_bytes = options.all_at_once
                      ? chunk_bytes + static_cast<int64_t>(p.nbytes())
                      : std::max(chunk_bytes, static_cast<int64_t>(p.nbytes()));
  }
  std::map<std::pair<std::string, int>, std::vector<size_t>> open;
  std::map<std::pair<std::string, int>, int64_t> open_bytes;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i];
    const auto key =
        std::make_pair(p.device().str(), static_cast<int>(p.scalar_type()));
    const int64_t bytes = static_cast<int64_t>(p.nbytes());
    if (!open[key].empty() && open_bytes[key] + bytes > chunk_bytes) {
      chunks_.push_back({std::move(open[key])});
      open[key].clear();
      open_bytes[key] = 0;
    }
    open[key].push_back(i);
    open_bytes[key] += bytes;
  }
  for (auto& [key, members] : open) {
    if (!members.empty()) chunks_.push_back({std::move(members)});
  }
}

int64_t ForeachOptimizer::state_tensors() const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    n += momentum_[i].defined() + exp_avg_[i].defined() +
         exp_avg_sq_[i].defined();
  }
  return n;
}

torch::Tensor ForeachOptimizer::step(LossClosure closure) {
  if (closure != nullptr) {
    throw std::invalid_argument("ForeachOptimizer::step takes no closure");
  }
  torch::NoGradGuard no_grad;
  for (const Chunk& chunk : chunks_) {
    std::vector<size_t> members;
    for (size_t i : chunk.members) {
      if (params_[i].grad().defined()) members.push_back(i);
    }
    if (members.empty()) continue;
    if (options_.kind == ForeachOptions::Kind::kSgd) {
      StepSgd(members);
    } else {
      StepAdam(members);
    }
  }
  return {};
}

// torch::optim::SGD: d = g + wd * p; with momentum, buf = g at the first
// step, then buf = m * buf + d; p -= lr * buf (or lr * d).
void ForeachOptimizer::StepSgd(const std::vector<size_t>& members) {
  const ForeachOptions& o = options_;
  std::vector<torch::Tensor> params = Pick(params_, members);
  std::vector<torch::Tensor> grads;
  grads.reserve(members.size());
  for (size_t i : members) grads.push_back(params_[i].grad());
  if (o.weight_decay != 0) {
    grads = at::_foreach_add(grads, params, o.weight_decay);
  }
  if (o.momentum != 0) {
    std::vector<torch::Tensor> bufs, buf_grads;
    for (size_t k = 0; k < members.size(); ++k) {
      torch::Tensor& buf = momentum_[members[k]];
      if (!buf.defined()) {
        buf = grads[k].clone().detach();
      } else {
        bufs.push_back(buf);
        buf_grads.push_back(grads[k]);
      }
    }
    if (!bufs.empty()) {
      at::_foreach_mul_(bufs, o.momentum);
      at::_foreach_add_(bufs, buf_grads, 1.0);
    }
    grads = Pick(momentum_, members);
  }
  at::_foreach_add_(params, grads, -o.lr);
}

// torch::optim::Adam / AdamW (amsgrad off): m = b1 m + (1 - b1) g,
// v = b2 v + (1 - b2) g^2, p -= lr / (1 - b1^t) * m / (sqrt(v) /
// sqrt(1 - b2^t) + eps); Adam adds wd * p to g, AdamW scales p by
// (1 - lr * wd) first.
void ForeachOptimizer::StepAdam(const std::vector<size_t>& members) {
  const ForeachOptions& o = options_;
  std::vector<torch::Tensor> params = Pick(params_, members);
  std::vector<torch::Tensor> grads;
  grads.reserve(members.size());
  for (size_t i : members) {
    grads.push_back(params_[i].grad());
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = torch::zeros_like(params_[i], at::MemoryFormat::Preserve);
      exp_avg_sq_[i] =
          torch::zeros_like(params_[i], at::MemoryFormat::Preserve);
    }
    ++steps_[i];
  }
  std::vector<torch::Tensor> exp_avg = Pick(exp_avg_, members);
  std::vector<torch::Tensor> exp_avg_sq = Pick(exp_avg_sq_, members);
  if (o.weight_decay != 0) {
    if (o.kind == ForeachOptions::Kind::kAdamW) {
      at::_foreach_mul_(params, 1 - o.lr * o.weight_decay);
    } else {
      grads = at::_foreach_add(grads, params, o.weight_decay);
    }
  }
  at::_foreach_mul_(exp_avg, o.beta1);
  at::_foreach_add_(exp_avg, grads, 1 - o.beta1);
  at::_foreach_mul_(exp_avg_sq, o.beta2);
  at::_foreach_addcmul_(exp_avg_sq, grads, grads, 1 - o.beta2);
  std::vector<c10::Scalar> bias2_sqrt, step_size;
  for (size_t i : members) {
    const double t = static_cast<double>(steps_[i]);
    bias2_sqrt.emplace_back(std::sqrt(1 - std::pow(o.beta2, t)));
    step_size.emplace_back(-o.lr / (1 - std::pow(o.beta1, t)));
  }
  std::vector<torch::Tensor> denom = at::_foreach_sqrt(exp_avg_sq);
  at::_foreach_div_(denom, bias2_sqrt);
  at::_foreach_add_(denom, o.eps);
  at::_foreach_addcdiv_(params, exp_avg, denom, step_size);
}

}  // namespace mutwo::worker
