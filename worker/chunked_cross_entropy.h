// Cross entropy that never holds a log-softmax of the whole output: the
// loss `--loss chunked_cross_entropy:TARGET` computes (docs/loss.md).
//
// torch's cross_entropy keeps log_softmax(logits) for its backward, and its
// backward makes a dense gradient of that before the logits' gradient: two
// tensors of the logits' size beside the logits. For a language model's
// [B,T,V] logits these set the step's peak (issue 27: the Transformer's
// floor). This loss keeps the logits themselves (the model made them; no
// new memory), computes the loss chunk of rows by chunk of rows, and its
// backward writes softmax(logits) - onehot(target), scaled, straight into
// the logits' gradient, chunk by chunk: beside the logits only their
// gradient and one chunk.
//
// The logits are not needed after this backward (the head that made them
// saves its input and weight, not its output), so their memory can hold
// their own gradient: with LogitsReuse, where nothing else holds that
// memory, the backward writes the gradient over the logits and the step
// holds one logits-sized tensor at the loss's backward instead of two.
//
// The same loss and gradient as torch's cross_entropy with mean reduction
// (no weights, no ignored index, no label smoothing), to rounding.
// Internal to the worker (includes LibTorch).
#ifndef MUTWO_WORKER_CHUNKED_CROSS_ENTROPY_H_
#define MUTWO_WORKER_CHUNKED_CROSS_ENTROPY_H_

#include <torch/torch.h>

#include <cstdint>

namespace mutwo::worker {

// Bytes of logits one chunk covers at most (rows of [N,V]: at most this
// many bytes and at most an eighth of the rows, at least one row).
inline constexpr int64_t kCrossEntropyChunkBytes = int64_t{128} << 20;

// Whether the backward may write the logits' gradient over the logits.
enum class LogitsReuse {
  // Never: a new tensor for the gradient.
  kNever,
  // The caller does not read the logits after the backward: reuse unless
  // another tensor shares their memory (a view of them, an autograd node's
  // saved copy of its output) or they are a leaf. The caller's own handles
  // on them may still exist (and read the gradient afterwards); an autograd
  // node that saved the same tensor fails its version check in backward.
  kCallerDone,
  // Nothing but this loss holds the logits at the backward (the worker,
  // which drops the model's outputs after the loss): reuse only when no
  // handle at all other than the loss's own is alive, so a graph that also
  // saved the logits for another node keeps them intact.
  kSoleHolder,
};

// Whether `target` has `logits`' shape without its last dimension (the
// classes), `logits` being at least 2-D: [N,V] with [N], [B,T,V] with
// [B,T].
bool ClassesLast(const torch::Tensor& logits, const torch::Tensor& target);

// The mean cross entropy of `logits` (floating point, classes in the last
// dimension) against class indices `target` (int64, each in [0,V), shaped
// as ClassesLast says). Differentiable in `logits`. `chunk_bytes` as
// kCrossEntropyChunkBytes (tests pass a small one).
torch::Tensor ChunkedCrossEntropy(
    const torch::Tensor& logits, const torch::Tensor& target,
    LogitsReuse reuse = LogitsReuse::kNever,
    int64_t chunk_bytes = kCrossEntropyChunkBytes);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_CHUNKED_CROSS_ENTROPY_H_
