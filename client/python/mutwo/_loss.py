"""`mutwo.chunked_cross_entropy`: the loss `chunked_cross_entropy:TARGET`
computes in the worker (worker/chunked_cross_entropy.h, docs/loss.md), for
a training loop that runs a schedule planned with it.

torch's `F.cross_entropy` keeps `log_softmax(logits)` for its backward and
its backward makes a dense gradient of that before the logits' gradient:
two tensors of the logits' size beside them. This one keeps the logits (no
new memory), computes the loss a chunk of rows at a time, and its backward
writes `(softmax(logits) - onehot(target)) * g / N` into the logits'
gradient a chunk at a time. The same loss and gradient as
`F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))` (mean, no
weights, no ignored index), to rounding.

With `reuse_logits=True` the backward writes the logits' gradient over the
logits (the layer that made them does not need them in its backward), as
the worker does: the step then holds one logits-sized tensor at the loss's
backward instead of two, which is what a schedule planned with this loss
counts. The caller must not read the logits after the backward (they hold
the gradient then). An autograd node that saved the same logits (a tanh
soft-cap saves its output) fails its version check in the backward, naming
the in-place modification; leave reuse off for such a model.
"""
from typing import Any

CHUNK_BYTES = 128 << 20  # as the worker's kCrossEntropyChunkBytes


def _rows_per_chunk(logits: Any, chunk_bytes: int) -> int:
    # As the worker: at most chunk_bytes and an eighth of the rows.
    row_bytes = max(1, logits.shape[1] * logits.element_size())
    eighth = (logits.shape[0] + 7) // 8
    return max(1, min(chunk_bytes // row_bytes, eighth))


def _function() -> Any:
    import torch

    class ChunkedCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: Any, target: Any,
                    chunk_bytes: int, reuse: bool) -> Any:
            # As the worker: a chunk's log-softmax and its target entries,
            # one sum at the end in float (double for double logits).
            n = logits.shape[0]
            rows = _rows_per_chunk(logits, chunk_bytes)
            picked = torch.empty((n, 1), dtype=logits.dtype,
                                 device=logits.device)
            index = target.unsqueeze(1)
            for start in range(0, n, rows):
                torch.gather(torch.log_softmax(logits[start:start + rows], 1),
                             1, index[start:start + rows],
                             out=picked[start:start + rows])
            ctx.save_for_backward(logits, target)
            ctx.chunk_bytes = chunk_bytes
            ctx.reuse = reuse
            acc = torch.float64 if logits.dtype == torch.float64 \
                else torch.float32
            return (picked.sum(dtype=acc) / -n).to(logits.dtype)

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            logits, target = ctx.saved_tensors
            n = logits.shape[0]
            rows = _rows_per_chunk(logits, ctx.chunk_bytes)
            scale = (grad_out / n).to(logits.dtype)
            root = logits if logits._base is None else logits._base
            if ctx.reuse and not root.is_leaf:
                grad = logits  # the softmax of a chunk over the chunk
            else:
                grad = torch.empty(logits.shape, dtype=logits.dtype,
                                   device=logits.device)
            for start in range(0, n, rows):
                g = grad[start:start + rows]
                torch.softmax(logits[start:start + rows], 1, out=g)
                g.mul_(scale)
            grad.scatter_add_(1, target.unsqueeze(1),
                              scale.neg().reshape(1, 1).expand(n, 1))
            return grad, None, None, None

    return ChunkedCrossEntropy


_FUNCTION = None


def chunked_cross_entropy(logits: Any, target: Any,
                          chunk_bytes: int = CHUNK_BYTES,
                          reuse_logits: bool = False) -> Any:
    """Mean cross entropy of `logits` (classes in the last dimension:
    `[N,V]`, `[B,T,V]`) against class indices `target` (`logits`' shape
    without the last dimension), holding no log-softmax of the whole
    output. `reuse_logits`: you do not read `logits` after the backward, so
    it writes their gradient over them (the worker's plans count on it; not
    for a leaf). ValueError names a shape that does not fit."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _function()
    if logits.dim() < 2 or tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            "chunked_cross_entropy: output shape %s does not fit target "
            "shape %s (classes must be the last output dimension and the "
            "target shaped like the output without it; for classes in "
            "dimension 1 use cross_entropy)"
            % (list(logits.shape), list(target.shape)))
    if logits.shape[-1] == 0 or target.numel() == 0:
        raise ValueError("chunked_cross_entropy: no rows or no classes "
                         "(output shape %s)" % list(logits.shape))
    classes = logits.shape[-1]
    return _FUNCTION.apply(logits.reshape(-1, classes), target.reshape(-1),
                           int(chunk_bytes), bool(reuse_logits))
