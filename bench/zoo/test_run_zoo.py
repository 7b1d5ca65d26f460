"""run_zoo.py's device sharing (`--jobs N`): a model that ran out of memory
beside others runs again alone, at once, and nothing runs beside it."""
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_zoo  # noqa: E402


def test_a_model_runs_alone_while_no_other_runs_and_the_rest_finish():
    gate = run_zoo.DeviceGate()
    lock = threading.Lock()
    running = set()
    beside_alone = []
    order = []

    def work(name, alone):
        with lock:
            if alone and running:
                beside_alone.append(sorted(running))
            for other in running:
                if other.endswith("(alone)"):
                    beside_alone.append([name, other])
            running.add(name + (" (alone)" if alone else ""))
            order.append(name + (" (alone)" if alone else ""))
        time.sleep(0.05)
        with lock:
            running.discard(name + (" (alone)" if alone else ""))

    def pooled(name):
        with gate.shared():
            work(name, False)
        if name == "big":  # ran out of memory beside the others
            with gate.alone():
                work(name, True)

    names = ["a", "big", "c", "d", "e", "f", "g", "h"]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(pooled, names))
    assert beside_alone == []
    assert sorted(n for n in order if "alone" not in n) == sorted(names)
    # At once, not after the whole pool: some models start after it.
    assert order.index("big (alone)") < len(order) - 1
