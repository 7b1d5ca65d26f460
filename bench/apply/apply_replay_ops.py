#!/usr/bin/env python3
"""What a step under `mutwo.apply` runs beyond the unmodified step, op by
op: the replays' work against the schedule's RECOMPUTE decisions.

One steady-state step (after 3 warm-up steps: apply's first forwards
learn) of the model unmodified and one under the schedule, each under a
TorchDispatchMode that counts every ATen op dispatched (forward, loss,
backward; no optimizer). The applied count minus the unmodified one is
what apply added: the replays' ops (what the planner's segments re-run,
and whatever a replay runs beyond them: a frame re-run from its start
re-runs functional ops before the segment) and PyTorch's own `detach` of
each tensor saved under saved-tensor hooks. Any device (`--device cpu`
counts the same ops a GPU dispatches; sizes do not change the counts).

    apply_replay_ops.py --model M --schedule S.json [--device cpu]
                        [--tier gpu] [--batch N] [--out FILE.json]

M is a model of apply_zoo_gpu.py's suite at its --tier size; S a schedule
planned for it (.json or .json.gz). Prints one JSON line: decisions (RECOMPUTE / SWAP, and
RECOMPUTE by op kind), ops_plain, ops_applied, extra (applied - plain per
op, the positive ones), missing (plain - applied, the positive ones),
replays (per frame, one step) and skipped calls.
"""
import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from apply_cpu_peak import schedule_doc  # noqa: E402
from apply_zoo_gpu import by_name, fresh_model  # noqa: E402


def count_ops(step):
    """Counter of ATen op names (overload packets) one call of step()
    dispatched."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    mode = Count()
    with mode:
        step()
    return mode.ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tier", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch
    import mutwo
    dev = torch.device(args.device)
    m = by_name(args.model, args.tier)
    m["loss_spec"] = m["loss"]
    m["batch"] = args.batch or m["batch"]
    schedule = mutwo.Schedule.from_json(
        json.dumps(schedule_doc(args.schedule)))
    # The same weights twice (fresh_model seeds them from the name).
    plain, inputs, loss_fn, _ = fresh_model(m, dev)
    model, _, _, applied = fresh_model(m, dev, schedule)

    def step_of(mod):
        def step():
            mod.zero_grad(set_to_none=True)
            loss_fn(mod(*inputs)).backward()
        return step
    for _ in range(3):
        step_of(model)()
        step_of(plain)()
    ops_plain = count_ops(step_of(plain))
    applied.reset_stats()
    ops_applied = count_ops(step_of(model))
    stats = applied.stats()
    recompute = [d for d in schedule.decisions if d.action == "RECOMPUTE"]
    res = dict(
        model=args.model, schedule=os.path.basename(args.schedule),
        device=str(dev), torch=torch.__version__, batch=m["batch"],
        recompute=len(recompute),
        swap=sum(d.action == "SWAP" for d in schedule.decisions),
        recompute_by_kind=dict(collections.Counter(
            d.op_kind for d in recompute).most_common()),
        ops_plain=sum(ops_plain.values()),
        ops_applied=sum(ops_applied.values()),
        extra=dict((ops_applied - ops_plain).most_common()),
        missing=dict((ops_plain - ops_applied).most_common()),
        replays=dict(stats.replays), skipped_calls=stats.skipped,
        dropped=stats.dropped, swapped_out=stats.swapped_out)
    line = json.dumps(res)
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
