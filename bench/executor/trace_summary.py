#!/usr/bin/env python3
"""Where a training step's time goes, from `mutwo-worker execute --trace_dir`.

Reads the Chrome traces the worker writes (unmodified.json, scheduled.json:
PyTorch profiler / Kineto format) and prints one JSON object per trace:

- wall_ms: first CPU op to the end of the last device activity;
- device_busy_ms / device_idle_ms: the union of kernels, copies and memsets
  on the device, and the rest of the wall;
- kernels: count;
- runtime: per CUDA runtime call that can block the host or the device
  (synchronisations, cudaMalloc/cudaFree, blocking copies): count and ms;
- scopes: per mutwo scope kind (`mutwo::replay segment`, `mutwo::forward
  segment`, `mutwo::backward segment`, `mutwo::offload value`, ...): count,
  host ms (the scopes' own durations) and the device ms of the kernels they
  launched (nested scopes count for each);
- idle_gaps: the largest gaps in device activity, with the innermost mutwo
  scope and the ATen op the host was in when the gap began.

Usage: trace_summary.py TRACE_DIR_OR_FILE... [--gaps N]
Standard library only (runs where the trace was written).
"""

import argparse
import bisect
import json
import os
import re
import sys

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
BLOCKING_RUNTIME = re.compile(
    r"cuda(Stream|Device|Event)Synchronize|cudaMalloc|cudaFree|"
    r"cudaMemcpy$|cudaHostAlloc|cudaMallocHost|cudaFreeHost|"
    r"cudaStreamWaitEvent")
SCOPE_KIND = re.compile(r"^(mutwo::[a-z]+(?: [a-z]+)?)")


def load_events(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def union_ms(intervals):
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total / 1000.0


def innermost(intervals_by_tid, tid, ts):
    """The innermost (latest-starting) interval of tid containing ts."""
    starts, items = intervals_by_tid.get(tid, ([], []))
    i = bisect.bisect_right(starts, ts) - 1
    best = None
    # Intervals are nested per thread: walk back while one could contain ts.
    while i >= 0:
        start, stop, name = items[i]
        if stop >= ts:
            best = name
            break
        i -= 1
        if len(items) - i > 4096:
            break
    return best


def index_by_tid(events):
    by = {}
    for e in events:
        by.setdefault(e.get("tid"), []).append(
            (e["ts"], e["ts"] + e["dur"], e["name"]))
    out = {}
    for tid, items in by.items():
        items.sort()
        out[tid] = ([s for s, _, _ in items], items)
    return out


def summarize(path, gaps=10):
    events = load_events(path)
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    scopes = [e for e in events if e.get("cat") == "user_annotation" and
              e["name"].startswith("mutwo::")]
    starts = [e["ts"] for e in cpu_ops + device]
    stops = [e["ts"] + e["dur"] for e in cpu_ops + device]
    if not starts:
        return {"trace": path, "error": "no events"}
    wall = (max(stops) - min(starts)) / 1000.0
    busy = union_ms([(e["ts"], e["ts"] + e["dur"]) for e in device])

    blocking = {}
    for e in runtime:
        if BLOCKING_RUNTIME.search(e["name"]):
            b = blocking.setdefault(e["name"], {"count": 0, "ms": 0.0})
            b["count"] += 1
            b["ms"] += e["dur"] / 1000.0

    # Kernels per launching runtime call (correlation id), then per scope.
    device_by_corr = {}
    for e in device:
        corr = e.get("args", {}).get("correlation")
        if corr is not None:
            device_by_corr[corr] = device_by_corr.get(corr, 0.0) + e["dur"]
    scope_index = index_by_tid(scopes)
    kinds = {}
    for e in scopes:
        m = SCOPE_KIND.match(e["name"])
        kind = m.group(1) if m else e["name"]
        k = kinds.setdefault(kind, {"count": 0, "host_ms": 0.0,
                                    "device_ms": 0.0})
        k["count"] += 1
        k["host_ms"] += e["dur"] / 1000.0
    for e in runtime:
        dev_us = device_by_corr.get(e.get("args", {}).get("correlation"))
        if not dev_us:
            continue
        # Every enclosing mutwo scope of the launch on its thread.
        starts_t, items = scope_index.get(e.get("tid"), ([], []))
        i = bisect.bisect_right(starts_t, e["ts"]) - 1
        seen = set()
        while i >= 0 and len(seen) < 8:
            start, stop, name = items[i]
            if stop >= e["ts"]:
                m = SCOPE_KIND.match(name)
                kind = m.group(1) if m else name
                if kind not in seen:
                    seen.add(kind)
                    kinds[kind]["device_ms"] += dev_us / 1000.0
            i -= 1
            if e["ts"] - start > 5e6:
                break

    # Gaps in device activity, with what the host was doing.
    ordered = sorted((e["ts"], e["ts"] + e["dur"]) for e in device)
    found, end = [], None
    for start, stop in ordered:
        if end is not None and start > end:
            found.append((start - end, end))
        end = stop if end is None else max(end, stop)
    found.sort(reverse=True)
    op_index = index_by_tid(cpu_ops)
    gap_rows = []
    for length, at in found[:gaps]:
        where = {}
        for tid in set(op_index) | set(scope_index):
            op = innermost(op_index, tid, at)
            scope = innermost(scope_index, tid, at)
            if op or scope:
                where[str(tid)] = {"op": op, "scope": scope}
        gap_rows.append({"ms": round(length / 1000.0, 3),
                         "at_ms": round((at - min(starts)) / 1000.0, 3),
                         "host": where})
    gaps_over = [g for g, _ in found if g >= 20]
    return {
        "trace": path,
        "wall_ms": round(wall, 3),
        "device_busy_ms": round(busy, 3),
        "device_idle_ms": round(wall - busy, 3) if device else None,
        "kernels": sum(1 for e in device if e.get("cat") == "kernel"),
        "cpu_ops": len(cpu_ops),
        "gaps_over_20us": {"count": len(gaps_over),
                           "ms": round(sum(gaps_over) / 1000.0, 3)},
        "runtime": {k: {"count": v["count"], "ms": round(v["ms"], 3)}
                    for k, v in sorted(blocking.items())},
        "scopes": {k: {kk: round(vv, 3) if isinstance(vv, float) else vv
                       for kk, vv in v.items()}
                   for k, v in sorted(kinds.items())},
        "idle_gaps": gap_rows,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+",
                        help="trace files, or folders holding *.json traces")
    parser.add_argument("--gaps", type=int, default=10,
                        help="how many of the largest idle gaps to list")
    args = parser.parse_args()
    files = []
    for p in args.paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p)
                            if f.endswith(".json"))
        else:
            files.append(p)
    if not files:
        sys.exit("trace_summary.py: no trace files in " + " ".join(args.paths))
    for f in files:
        print(json.dumps(summarize(f, args.gaps), sort_keys=True))


if __name__ == "__main__":
    main()
