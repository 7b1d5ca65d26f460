#!/usr/bin/env python3
"""Where the peak of one training step lies, eager and under `mutwo.apply`
(CUDA only): the caching allocator's history
(`torch.cuda.memory._record_memory_history`, Python stacks) over one
steady-state step (after 3 warm-up steps: apply's first forwards learn),
replayed to the step's highest allocated byte count, and what was live
there, grouped by where it was allocated.

    apply_memsnap.py --model M [--schedule S.json] --out DIR
                     [--device cuda:0] [--batch N] [--loss-spec L]
                     [--variants eager,applied,applied_no_swaps]
                     [--optimizer adam:foreach] [--prefetch-ahead K]

M is a model of apply_zoo_gpu.py's suite (its GPU-tier size and batch);
S a schedule planned for it (apply_zoo_gpu.py writes them beside its
points). Variants: `eager` (the unmodified model), `applied` (strict
apply), `applied_no_swaps` (the schedule's SWAP decisions as RETAIN,
strict=False); --prefetch-ahead goes to mutwo.apply (how many swapped
tensors an unpack copies back ahead). Per variant one JSON file
DIR/memsnap_M_VARIANT.json and a line on stdout:
  base_bytes        allocated when the recorded step began (parameters,
                    optimizer state, inputs)
  peak_bytes        base + the replayed maximum; torch_max_bytes is
                    torch.cuda.max_memory_allocated over the same step (the
                    two agree when the replay matches the allocator's count)
  peak_phase        zero_grad / forward / backward / optimizer, with
                    peak_event_fraction (how far into that phase, by events)
  phase_end_bytes   allocated at the end of each phase
  at_peak           the blocks allocated during the step and live at the
                    peak, grouped by (phase allocated, where): where is the
                    innermost frame in the model's, torch.nn's, torch.optim's
                    or mutwo's Python code, with mutwo's own innermost
                    function when it differs; "(no Python frame)" for
                    allocations made by the autograd engine's device thread
  freed_before      bytes of blocks older than the step freed before the peak
"""
import argparse
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from apply_zoo_gpu import by_name, fresh_model, without_swaps  # noqa: E402

PHASES = ("zero_grad", "forward", "backward", "optimizer")
# Frames that say where an allocation was asked for, innermost first.
WHERE = ("/mutwo/", "/bench/zoo/", "/torchvision/models/", "/torch/nn/",
         "/torch/optim/", "/timm/", "/transformers/")


def _where(frames):
    if not frames:
        return "(no Python frame)"
    mine = next((f for f in frames if "/mutwo/" in f["filename"]), None)
    first = next((f for f in frames
                  if any(w in f["filename"] for w in WHERE)), None)
    if first is None:
        f = frames[0]
        return f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"
    parts = []
    for f in (first, mine):
        if f is None or (parts and f is first):
            continue
        path = f["filename"]
        for w in WHERE:
            if w in path:
                path = w.strip("/") + "/" + path.split(w, 1)[1]
                break
        s = f"{path}:{f['line']} {f['name']}"
        if s not in parts:
            parts.append(s)
    return " <- ".join(parts)


def _mark(dev, marks, name):
    """A boundary in the recorded history: a 512-byte block allocated from
    this function (found by its frame) and freed at once."""
    import torch
    torch.empty(512, dtype=torch.uint8, device=dev)
    marks.append(name)


def replay(trace, base, marks):
    """The step's allocated count over the trace: its maximum, where, and
    the step's blocks live there."""
    phase_of = []  # per entry: index into PHASES
    phase = 0
    live = {}
    cur = 0
    peak, peak_at = 0, -1
    freed_old = 0
    ends = {}
    mark_seen = 0
    for i, e in enumerate(trace):
        a = e.get("action")
        size = int(e.get("size", 0))
        addr = e.get("addr")
        if a == "alloc":
            frames = e.get("frames") or []
            if size == 512 and frames and any(f["name"] == "_mark"
                                               for f in frames[:3]):
                ends[PHASES[min(phase, len(PHASES) - 1)]] = base + cur
                mark_seen += 1
                phase = min(mark_seen, len(PHASES) - 1)
                live[addr] = None  # the mark's own free is skipped
                phase_of.append(phase)
                continue
            live[addr] = (size, phase, frames)
            cur += size
        elif a == "free_requested":
            if addr in live:
                blk = live.pop(addr)
                if blk is not None:
                    cur -= blk[0]
            else:
                cur -= size
                freed_old += size
        phase_of.append(phase)
        if cur > peak:
            peak, peak_at = cur, i
    ends[PHASES[min(phase, len(PHASES) - 1)]] = base + cur
    # Live at the peak: replay again up to it.
    live = {}
    freed_before = 0
    for e in trace[:peak_at + 1]:
        a, addr = e.get("action"), e.get("addr")
        if a == "alloc":
            live[addr] = (int(e.get("size", 0)), e.get("frames") or [])
        elif a == "free_requested":
            if live.pop(addr, None) is None:
                freed_before += int(e.get("size", 0))
    groups = {}
    pphase = phase_of[peak_at] if peak_at >= 0 else 0
    for addr, (size, frames) in live.items():
        if size == 512 and frames and any(f["name"] == "_mark"
                                          for f in frames[:3]):
            continue
        key = _where(frames)
        g = groups.setdefault(key, [0, 0])
        g[0] += size
        g[1] += 1
    in_phase = [i for i, p in enumerate(phase_of) if p == pphase]
    frac = ((peak_at - in_phase[0]) / max(1, len(in_phase) - 1)
            if in_phase and peak_at >= 0 else None)
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return dict(peak_bytes=base + peak, peak_phase=PHASES[pphase],
                peak_event_fraction=None if frac is None else round(frac, 3),
                events=len(trace), peak_event=peak_at,
                phase_end_bytes=ends, freed_before=freed_before,
                at_peak=[dict(where=k, bytes=v[0], blocks=v[1])
                         for k, v in top[:40]],
                at_peak_total=sum(v[0] for v in groups.values()))


def one(args, m, label, schedule):
    import torch
    dev = torch.device(args.device)
    model, inputs, loss_fn, applied = fresh_model(
        m, dev, schedule, strict=label == "applied",
        prefetch_ahead=args.prefetch_ahead)
    from mutwo._verify import make_optimizer
    opt = make_optimizer(args.optimizer, model.parameters())

    def step(marks=None):
        opt.zero_grad(set_to_none=True)
        if marks is not None:
            _mark(dev, marks, "zero_grad")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = loss_fn(model(*inputs))
        if marks is not None:
            _mark(dev, marks, "forward")
        loss.backward()
        del loss
        if marks is not None:
            _mark(dev, marks, "backward")
        opt.step()
    for _ in range(3):
        step()
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.memory._record_memory_history(
        enabled="all", context="alloc", stacks="python", max_entries=2000000)
    marks = []
    step(marks)
    torch.cuda.synchronize(dev)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    torch_max = torch.cuda.max_memory_allocated(dev)
    trace = snap["device_traces"][dev.index or 0]
    res = dict(model=m["name"], batch=m["batch"], variant=label,
               schedule=os.path.basename(args.schedule) if schedule
               is not None else None, base_bytes=base,
               torch_max_bytes=torch_max, device=torch.cuda.get_device_name(
                   dev), torch=torch.__version__)
    res.update(replay(trace, base, marks))
    if applied is not None:
        s = applied.stats()
        res.update(dropped=s.dropped, swapped_out=s.swapped_out,
                   swapped_in=s.swapped_in)
        applied.remove()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--schedule", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--loss-spec", default="")
    ap.add_argument("--variants", default="eager,applied")
    ap.add_argument("--optimizer", default="adam:foreach",
                    help="as planned; torch.optim's as `mutwo verify` "
                    "makes it (adam:foreach: torch.optim.Adam's default "
                    "on CUDA)")
    ap.add_argument("--prefetch-ahead", type=int, default=2)
    args = ap.parse_args()
    import torch
    import mutwo
    if not torch.cuda.is_available() or not args.device.startswith("cuda"):
        raise SystemExit("apply_memsnap.py: needs a CUDA device (the "
                         "caching allocator's history)")
    m = by_name(args.model, "gpu")
    m["loss_spec"] = args.loss_spec or m["loss"]
    m["batch"] = args.batch or m["batch"]
    schedule = (mutwo.Schedule.from_json(args.schedule)
                if args.schedule else None)
    os.makedirs(args.out, exist_ok=True)
    for label in args.variants.split(","):
        sched = None
        if label == "applied":
            sched = schedule
        elif label == "applied_no_swaps":
            sched = without_swaps(args.schedule)
        elif label != "eager":
            raise SystemExit(f"unknown variant {label!r}")
        if label != "eager" and schedule is None:
            raise SystemExit(f"variant {label} needs --schedule")
        res = one(args, m, label, sched)
        with open(os.path.join(args.out,
                               f"memsnap_{m['name']}_{label}.json"), "w") as f:
            json.dump(res, f, indent=1)
        short = {k: v for k, v in res.items() if k != "at_peak"}
        short["at_peak_top"] = [(g["where"][-90:], g["bytes"])
                                for g in res["at_peak"][:8]]
        print(json.dumps(short), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
