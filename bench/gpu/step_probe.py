#!/usr/bin/env python3
"""One plain training step of a benchmark model at a batch size, as a user
would run it (TorchScript module, Adam, cross entropy, no checkpointing), in
a fresh process: prints one JSON line {fits, peak_bytes, iteration_ms} and
exits 0, or reports the out-of-memory error (fits false).

    step_probe.py MODEL.pt resnet152|transformer BATCH [--iterations 2]
"""
import json
import sys
import time

import torch


def inputs(kind, batch, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    if kind == "resnet152":
        x = torch.randn(batch, 3, 224, 224, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
    else:
        x = torch.randint(0, 30000, (batch, 128), generator=g)
        y = torch.randint(0, 30000, (batch, 128), generator=g)
    return x.to(device), y.to(device)


def loss_of(out, y):
    return torch.nn.functional.cross_entropy(
        out.reshape(-1, out.shape[-1]), y.reshape(-1))


def main():
    path, kind, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    iterations = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    device = torch.device("cuda:0")
    model = torch.jit.load(path, map_location=device)
    model.train()
    opt = torch.optim.Adam(model.parameters())
    result = {"batch": batch}
    try:
        x, y = inputs(kind, batch, device)
        times = []
        for _ in range(iterations + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            # The output is not held past the loss (as mutwo's steps do):
            # holding it through backward would keep one more output-sized
            # tensor (the Transformer's logits: 15.4 MB a sample).
            loss = loss_of(model(x), y)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
            del loss
        times = sorted(times[1:])
        result.update(fits=True,
                      peak_bytes=torch.cuda.max_memory_allocated(device),
                      reserved_bytes=torch.cuda.max_memory_reserved(device),
                      iteration_ms=times[len(times) // 2])
    except torch.cuda.OutOfMemoryError as e:
        result.update(fits=False, error=str(e).splitlines()[0][:400])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
