"""Does the garbage collector's work show up in ``%gpumem who``'s time? (GPU machine)

    python3 benchmarks/probes/probe_who_gc.py

Issue 13's case (10k tracked tensors, 100k other objects): ``who`` timed 9 times with the
collector as it is, counting the collections that ran during each call and their time
(``gc.callbacks``), then 9 times with the collector paused around the call.
"""

from __future__ import annotations

import gc
import statistics
import time

from who_case import who_shell

_, attributor = who_shell(junk=True)
events: list[tuple[int, float]] = []
started: list[float] = []


def watch(phase: str, info: dict) -> None:
    if phase == "start":
        started.append(time.perf_counter())
    else:
        events.append((info["generation"], time.perf_counter() - started.pop()))


print(f"objects tracked by the collector: {len(gc.get_objects())}, thresholds {gc.get_threshold()}")
for paused in (False, True, False, True):
    times, collections = [], []
    for _ in range(9):
        events.clear()
        gc.callbacks.append(watch)
        if paused:
            gc.disable()
        t0 = time.perf_counter()
        attributor.who(0, "variable", 20)
        dt = time.perf_counter() - t0
        gc.enable()
        gc.callbacks.remove(watch)
        times.append(dt * 1e3)
        collections.append(list(events))
    gen = [sum(1 for g, _ in c if g == 2) for c in collections]
    spent = [sum(t for _, t in c) * 1e3 for c in collections]
    print(
        f"{'paused' if paused else 'as is '}: median {statistics.median(times):.1f} ms "
        f"(min {min(times):.1f}); collections per call {[len(c) for c in collections]}, "
        f"full ones {gen}, ms in them: median {statistics.median(spent):.1f}"
    )
