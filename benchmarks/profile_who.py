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

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    ip = InteractiveShell.instance()
    with capture_output():
        ip.run_cell("import torch\ntorch.empty(0, device='cuda')")
        ip.run_line_magic("load_ext", "jupyter_gpumem")
        ip.run_cell("%gpumem track on")
        ip.run_cell("acts = [torch.empty(4096, device='cuda') for _ in range(10_000)]")
        ip.run_cell("junk = [{'i': i, 'v': [i, str(i)]} for i in range(50_000)]")
    from jupyter_gpumem._ipython import current

    attributor = current().attributor
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
