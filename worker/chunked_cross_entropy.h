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
// The same loss and gradient as torch's cross_entropy with mean reduction
// (no weights, no ignored index, no label smoothing), to rounding.
// Internal to the worker (includes LibTorch).
#ifndef MUTWO_WORKER_CHUNKED_CROSS_ENTROPY_H_
#define MUTWO_WORKER_CHUNKED_CROSS_ENTROPY_H_

#include <torch/torch.h>

#include <cstdint>

namespace mutwo::worker {

// Bytes of logits one chunk covers (rows of [N,V] at most this many bytes,
// at least one row).
inline constexpr int64_t kCrossEntropyChunkBytes = int64_t{128} << 20;

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
    int64_t chunk_bytes = kCrossEntropyChunkBytes);

}  // namespace mutwo::worker

#endif  // MUTWO_WORKER_CHUNKED_CROSS_ENTROPY_H_
