#!/usr/bin/env python3
"""Time and peak of one loss forward + backward: torch's F.cross_entropy
against mutwo.chunked_cross_entropy (the Python twin of the worker's
`chunked_cross_entropy` loss, the same kernels), on the logits of the bench
Transformer (batch 64 x 128 tokens x 30000 classes) and the GPT decoder
(16 x 256 x 32000), at several chunk sizes. One JSON line per case:

    PYTHONPATH=client/python python3 bench/loss/chunked_loss.py \
        [--device cuda:0] [--iterations 20] > OUT/chunked_loss.jsonl

`peak_over_logits_bytes`: the peak allocated during the loss's forward and
backward above what was allocated before it (the logits), in bytes; with
F.cross_entropy it holds the log-softmax, its gradient and the logits'
gradient, with the chunked loss the logits' gradient and one chunk.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

import mutwo

SHAPES = {"transformer": (64 * 128, 30000), "gpt": (16 * 256, 32000)}


def measure(fn, logits, target, device, iterations):
    def once():
        x = logits.detach().requires_grad_()
        fn(x, target).backward()
        return x.grad
    for _ in range(3):
        once()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(iterations):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        g = once()
        if cuda:
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
        del g
    times.sort()
    out = {"ms_median": times[len(times) // 2], "ms_min": times[0]}
    if cuda:
        out["peak_over_logits_bytes"] = (torch.cuda.max_memory_allocated(device)
                                         - before)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available()
                    else "cpu")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--shapes", default="transformer,gpt")
    args = ap.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" \
        else "cpu"
    for shape in args.shapes.split(","):
        n, v = SHAPES[shape]
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(n, v, generator=g).to(device)
        target = torch.randint(0, v, (n,), generator=g).to(device)
        cases = [("cross_entropy", None, F.cross_entropy)]
        for mib in (8, 32, 128):
            cases.append(("chunked_cross_entropy", mib,
                          lambda x, t, b=mib << 20:
                          mutwo.chunked_cross_entropy(x, t, chunk_bytes=b)))
        for loss, mib, fn in cases:
            rec = {"shape": shape, "rows": n, "classes": v, "loss": loss,
                   "chunk_mib": mib, "device": name,
                   "torch": torch.__version__,
                   "logits_bytes": logits.numel() * logits.element_size()}
            rec.update(measure(fn, logits, target, device, args.iterations))
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
