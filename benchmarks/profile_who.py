"""Where does ``%gpumem who`` spend its time, on a GPU? Issue 13's case: 10k live tensors
(allocation sites tracked) and 100k other objects in the namespace; ``who`` by variable
and by line under cProfile, the functions with the most own and cumulative time.

    python3 benchmarks/profile_who.py [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

from probes.who_case import who_shell


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    _, attributor = who_shell(junk=True)
    for by in ("variable", "line"):
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            attributor.who(0, by, 20)
            times.append(time.perf_counter() - t0)
        print(f"who by {by}: median {statistics.median(times) * 1e3:.1f} ms")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3):
            attributor.who(0, by, 20)
        pr.disable()
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(pr, stream=out).sort_stats(key).print_stats(a.top)
            print(f"\n== who by {by}, 3 calls, by {key}")
            print("\n".join(out.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()
