#!/usr/bin/python3
"""A PyTorch training loop with a mutwo schedule (the repository README's
example): a torchvision model, a synthetic data loader, AdamW.

    train_torchvision.py --server 127.0.0.1:50051 --model resnet18 \\
        --batch 32 --image 224 --budget auto --steps 20 [--device cuda]

Credentials: MUTWO_TOKEN / MUTWO_TOKEN_FILE and MUTWO_TLS_CA (or --tls_ca).
"""
import argparse

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, TensorDataset

import mutwo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default="127.0.0.1:50051")
    p.add_argument("--tls_ca", default=None)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--budget", default="auto")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()

    model = getattr(torchvision.models, args.model)(num_classes=100)
    data = TensorDataset(torch.randn(args.batch * 4, 3, args.image, args.image),
                         torch.randint(0, 100, (args.batch * 4,)))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True,
                        drop_last=True)

    # 1. Plan: upload the model (scripted for you), profile, plan, validate.
    client = mutwo.Client(args.server, tls_ca=args.tls_ca)
    job = client.submit(
        model, inputs=[f"x:float32[B,3,{args.image},{args.image}]"],
        batch_sizes=[args.batch], budgets=[args.budget],
        loss="cross_entropy:y:int64[B]{0,100}", optimizer="adamw",
        device_kind="cuda" if args.device.startswith("cuda") else "cpu")
    job = client.wait(job)                    # progress bar on stderr
    schedule = client.schedule(job, args.batch, args.budget)
    print(schedule)                            # module paths, ops, sizes

    # 2. Train in your own loop with the schedule applied.
    model.to(args.device).train()
    applied = mutwo.apply(model, schedule)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(args.device), y.to(args.device)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"step {step}: loss {loss.item():.4f}")
            step += 1
            if step == args.steps:
                break
    print(applied.report())


if __name__ == "__main__":
    main()
