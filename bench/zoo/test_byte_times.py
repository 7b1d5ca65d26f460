"""byte_times.py: a profile's times from its bytes, so a plan is the same
on every machine; derived times filled in as the profiler fills them in."""
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from byte_times import MS_PER_BYTE, MS_PER_OP, times_from_bytes  # noqa: E402


def profile(ms):
    """Three ops (ids 0-2; 3 is not an op), two backward steps (ids 4, 5),
    one activation made by op 1, idle from after op 2 to step 5. `ms`: the
    measured time every time field gets."""
    node = lambda i, after, is_op=True: dict(  # noqa: E731
        id=i, is_op=is_op, allocated_bytes_after=str(after),
        transient_bytes="0", forward_ms=ms, backward_ms=ms, host_ms=ms)
    return dict(
        nodes=[node(0, 1000), node(1, 11000), node(2, 31000),
               node(3, 31000, False)],
        backward_steps=[dict(ms=ms, peak_bytes_during="41000",
                             allocated_bytes_after="21000", forward_node=2),
                        dict(ms=ms, peak_bytes_during="21000",
                             allocated_bytes_after="1000")],
        activations=[dict(producer_node=1, size_bytes="10000",
                          last_forward_use=2, first_backward_use=5,
                          recompute_nodes=[1], inactive_ms=ms,
                          recompute_ms=ms)],
        measured=dict(loss_bytes="0", iteration_ms=ms, loss_ms=ms),
        fixed=dict(parameter_bytes="0"))


def test_the_times_measured_do_not_change_the_profile_planned_from():
    assert times_from_bytes(profile(0.5)) == times_from_bytes(profile(7.0))


def test_op_times_grow_with_the_bytes_they_allocate():
    p = times_from_bytes(profile(1.0))
    ms = [n["forward_ms"] for n in p["nodes"]]
    assert ms[0] == MS_PER_OP
    assert ms[1] == MS_PER_OP + 10000 * MS_PER_BYTE
    assert ms[2] == MS_PER_OP + 20000 * MS_PER_BYTE
    assert ms[3] == 0  # not an op
    assert all(n["host_ms"] == 0 for n in p["nodes"])
    # A node's backward time: the backward steps mapped to it.
    assert [n["backward_ms"] for n in p["nodes"]] == \
        [0, 0, p["backward_steps"][0]["ms"], 0]


def test_derived_times_are_filled_in_as_the_profiler_does():
    p = times_from_bytes(profile(1.0))
    a = p["activations"][0]
    node_ms = [n["forward_ms"] for n in p["nodes"]]
    step_ms = [s["ms"] for s in p["backward_steps"]]
    assert a["recompute_ms"] == node_ms[1]
    # After its last forward use (op 2): node 3, the loss, then backward
    # steps before its first use (id 5 = the second step).
    assert abs(a["inactive_ms"] - (node_ms[3] + p["measured"]["loss_ms"] +
                                   step_ms[0])) < 1e-12
    m = p["measured"]
    assert abs(m["iteration_ms"] - (sum(node_ms) + sum(step_ms) +
                                    m["loss_ms"] + m["optimizer_ms"])) < 1e-12


def test_a_seed_gives_other_times_the_same_every_time():
    base = times_from_bytes(profile(1.0))
    one = times_from_bytes(profile(1.0), seed=1)
    assert one == times_from_bytes(profile(1.0), seed=1)
    assert one != base
    assert one != times_from_bytes(profile(1.0), seed=2)
    # Only times change.
    strip = copy.deepcopy(one)
    for n, b in zip(strip["nodes"], base["nodes"]):
        for k in ("forward_ms", "backward_ms"):
            n[k] = b[k]
    assert strip["nodes"] == base["nodes"]
