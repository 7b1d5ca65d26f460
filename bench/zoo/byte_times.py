"""Times for a profile computed from its memory figures, not the clock.

A plan depends on the profile's times (what a recompute costs, how long an
activation sits idle for a swap), and a CPU profile's times differ run to
run and machine to machine: the same model got a different floor schedule
on CI than here, and a bar judged on one schedule was judged on another.
`times_from_bytes` replaces every time in a profile with one computed from
the bytes each op allocates, filled in as worker/profiler.cc fills in the
derived ones, so a plan is a function of the model and its memory figures:
the same schedule on every machine. With `seed`, each op's time is scaled
by a seeded random factor instead (0.25x to 4x): other schedules of the
same model, reproducibly, to look for what one schedule does not show.

Memory figures are untouched: what a schedule holds is the same; only which
activations the planner prefers to recompute, swap or keep changes.
"""
import random

# One byte allocated costs this many ms (10 GB/s), plus a fixed cost per
# op: the order of a CPU step, so that a 1 GB/s modeled link still leaves
# swaps the planner takes.
MS_PER_BYTE = 1e-7
MS_PER_OP = 2e-3


def times_from_bytes(profile, seed=None):
    """Rewrites `profile` (a `mutwo-worker profile --output json` object)
    in place; returns it."""
    rng = random.Random(seed) if seed is not None else None

    def cost(nbytes):
        ms = MS_PER_OP + MS_PER_BYTE * max(0, nbytes)
        return ms * (4.0 ** rng.uniform(-1, 1)) if rng else ms

    nodes = profile.get("nodes", [])
    node_ms = []
    before = int(nodes[0].get("allocated_bytes_after", 0)) if nodes else 0
    for node in nodes:
        after = int(node.get("allocated_bytes_after", 0))
        ms = cost(after - before + int(node.get("transient_bytes", 0))) \
            if node.get("is_op") else 0.0
        before = after
        node_ms.append(ms)
        node["forward_ms"] = ms
        node["backward_ms"] = 0.0  # below: its backward steps' times
        node["host_ms"] = 0.0
    step_ms = []
    before = int(nodes[-1].get("allocated_bytes_after", 0)) if nodes else 0
    for step in profile.get("backward_steps", []):
        peak = int(step.get("peak_bytes_during", 0))
        step["ms"] = cost(peak - before)
        before = int(step.get("allocated_bytes_after", 0))
        step_ms.append(step["ms"])
        owner = int(step.get("forward_node", -1))
        if 0 <= owner < len(nodes):
            nodes[owner]["backward_ms"] += step["ms"]
    m = profile.setdefault("measured", {})
    fixed = profile.get("fixed", {})
    m["loss_ms"] = cost(int(m.get("loss_bytes", 0)))
    m["optimizer_ms"] = cost(2 * int(fixed.get("parameter_bytes", 0)) +
                             int(fixed.get("optimizer_state_bytes", 0)))
    m["forward_ms"] = sum(node_ms)
    m["backward_ms"] = sum(step_ms)
    iteration = (m["forward_ms"] + m["loss_ms"] + m["backward_ms"] +
                 m["optimizer_ms"])
    for key in ("iteration_ms", "instrumented_iteration_ms",
                "module_iteration_ms"):
        if key in m:
            m[key] = iteration
    if "replay_overhead_ms" in m:
        m["replay_overhead_ms"] = 0.0
    # As the profiler derives them: an activation idles from after its last
    # forward use, through the loss, to its first backward use (ids past the
    # nodes number the backward steps); its recompute runs its nodes again.
    n = len(nodes)
    forward_after = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        forward_after[i] = forward_after[i + 1] + node_ms[i]
    backward_before = [0.0]
    for ms in step_ms:
        backward_before.append(backward_before[-1] + ms)
    for a in profile.get("activations", []):
        last = int(a["last_forward_use"])
        first = int(a["first_backward_use"]) - n
        a["inactive_ms"] = (forward_after[min(n, last + 1)] + m["loss_ms"] +
                            backward_before[max(0, min(len(step_ms), first))])
        a["recompute_ms"] = sum(node_ms[i] for i in a.get("recompute_nodes",
                                                          []))
    return profile
