#include "worker/chunked_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "common/logging.h"

namespace mutwo::worker {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows of [N,V] `logits` a chunk covers: at most `chunk_bytes` and at most
// an eighth of the rows (so the forward's one temporary stays small beside
// the logits whatever their size), at least one row.
int64_t RowsPerChunk(const torch::Tensor& logits, int64_t chunk_bytes) {
  const int64_t row_bytes =
      std::max<int64_t>(1, logits.size(1) * logits.element_size());
  const int64_t eighth = (logits.size(0) + 7) / 8;
  return std::max<int64_t>(1, std::min(chunk_bytes / row_bytes, eighth));
}

// Whether the backward may write over `logits` (the saved [N,V] tensor, as
// unpacked in the backward): see LogitsReuse. Counts handles: the storage is
// held by the saved tensor and, for a view, by its base, and by nothing
// else; the saved tensor itself by the saved variable and the unpacked copy.
bool MayReuse(const torch::Tensor& logits, LogitsReuse reuse) {
  if (reuse == LogitsReuse::kNever || !logits.has_storage()) return false;
  const bool view = logits.is_view();
  const at::TensorBase& root = view ? logits._base() : logits;
  const bool reused =
      !root.is_leaf() && logits.storage().use_count() == (view ? 2 : 1) &&
      (reuse == LogitsReuse::kCallerDone ||
       (logits.use_count() <= 2 && (!view || root.use_count() == 1)));
  MUTWO_LOG(debug,
            "chunked cross entropy: logits' gradient {} (storage handles {}, "
            "tensor handles {}, view {}, base handles {})",
            reused ? "written over the logits" : "in a new tensor",
            logits.storage().use_count(), logits.use_count(), view,
            view ? root.use_count() : 0);
  return reused;
}

class ChunkedCrossEntropyFunction
    : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx,
                               const torch::Tensor& logits,
                               const torch::Tensor& target, LogitsReuse reuse,
                               int64_t chunk_bytes) {
    const int64_t n = logits.size(0);
    const int64_t rows = RowsPerChunk(logits, chunk_bytes);
    // Two kernels a chunk: its log-softmax (the one temporary), and the
    // target's entry of it into `picked`; one sum at the end, in float (or
    // double) whatever the logits' dtype, like torch's reduction.
    torch::Tensor picked = torch::empty({n, 1}, logits.options());
    const torch::Tensor index = target.unsqueeze(1);
    for (int64_t start = 0; start < n; start += rows) {
      const int64_t len = std::min(rows, n - start);
      torch::Tensor out = picked.narrow(0, start, len);
      torch::gather_out(out,
                        torch::log_softmax(logits.narrow(0, start, len), 1), 1,
                        index.narrow(0, start, len));
    }
    ctx->save_for_backward({logits, target});
    ctx->saved_data["chunk_bytes"] = chunk_bytes;
    ctx->saved_data["reuse"] = static_cast<int64_t>(reuse);
    const auto sum_type =
        logits.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    return (picked.sum(sum_type) / static_cast<double>(-n))
        .to(logits.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& logits = saved[0];
    const torch::Tensor& target = saved[1];
    const int64_t n = logits.size(0);
    const int64_t rows =
        RowsPerChunk(logits, ctx->saved_data["chunk_bytes"].toInt());
    // d loss / d logits = (softmax(logits) - onehot(target)) * g / N:
    // softmax and scale a chunk at a time (the chunk still in cache), then
    // one scatter of -g/N at the targets.
    const torch::Tensor scale =
        (grad_outputs[0] / static_cast<double>(n)).to(logits.scalar_type());
    // The gradient over the logits where they may be reused (the softmax
    // of a chunk written over the chunk), else a new tensor.
    torch::Tensor grad =
        MayReuse(logits,
                 static_cast<LogitsReuse>(ctx->saved_data["reuse"].toInt()))
            ? logits
            : torch::empty(logits.sizes(), logits.options());
    for (int64_t start = 0; start < n; start += rows) {
      const int64_t len = std::min(rows, n - start);
      torch::Tensor g = grad.narrow(0, start, len);
      torch::softmax_out(g, logits.narrow(0, start, len), 1);
      g.mul_(scale);
    }
    grad.scatter_add_(1, target.unsqueeze(1),
                      scale.neg().reshape({1, 1}).expand({n, 1}));
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool ClassesLast(const torch::Tensor& logits, const torch::Tensor& target) {
  return logits.dim() >= 2 && target.dim() == logits.dim() - 1 &&
         target.sizes() == logits.sizes().slice(0, target.dim());
}

torch::Tensor ChunkedCrossEntropy(const torch::Tensor& logits,
                                  const torch::Tensor& target,
                                  LogitsReuse reuse, int64_t chunk_bytes) {
  TORCH_CHECK(ClassesLast(logits, target),
              "chunked cross entropy: target must be the logits' shape "
              "without the last dimension");
  TORCH_CHECK(target.numel() > 0, "chunked cross entropy: no rows");
  const int64_t classes = logits.size(-1);
  return ChunkedCrossEntropyFunction::apply(
      logits.reshape({-1, classes}), target.reshape({-1}), reuse, chunk_bytes);
}

}  // namespace mutwo::worker
