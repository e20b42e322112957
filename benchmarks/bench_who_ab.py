"""``%gpumem who`` of two versions of the package, interleaved (GPU machine).

    python3 benchmarks/bench_who_ab.py --base PATH [--rounds 40] [--json out.json]

Issue 13's case: 10k live tensors with allocation sites tracked, alone and then beside
100k other objects in the namespace. Two kernels' worth of state are set up once, one
process per version (``--base``: a tree holding another ``jupyter_gpumem``; this tree
for the other), and the driver asks them in turn for one timed ``who`` each, round after
round. A host's speed drifts by tens of per cent between processes started minutes apart;
taking the two versions' calls alternately, in the same minutes, leaves only the
difference of the code. Prints the median and quartiles of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])  # this tree's benchmarks/probes: the case, for both versions
from who_case import add_junk, who_shell
ip, attributor = who_shell()
import jupyter_gpumem
print("ready", jupyter_gpumem.__file__, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "junk":
        add_junk(ip)
        print("ok", flush=True)
        continue
    t0 = time.perf_counter()
    reports = attributor.who(0, cmd[0], 20)
    ms = (time.perf_counter() - t0) * 1e3
    print(f"{ms} {sum(r.blocks for r in reports[0].rows)}", flush=True)
"""


PROBES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes")


class Kernel:
    def __init__(self, path: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([path, *filter(None, [env.get("PYTHONPATH")])])
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, PROBES],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=path,
        )
        ready = self.ask(None)
        assert ready.startswith("ready"), ready
        self.module = ready.split()[1]

    def ask(self, cmd: str | None) -> str:
        assert self.p.stdin is not None and self.p.stdout is not None
        if cmd is not None:
            self.p.stdin.write(cmd + "\n")
            self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def who(self, by: str) -> tuple[float, int]:
        ms, blocks = self.ask(by).split()
        return float(ms), int(blocks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--json")
    a = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    kernels = {"base": Kernel(os.path.abspath(a.base)), "new": Kernel(here)}
    for name, k in kernels.items():
        print(f"{name}: {k.module}")
    out: dict = {}
    for case in ("10k tensors", "10k tensors + 100k objects"):
        if case.endswith("objects"):
            for k in kernels.values():
                assert k.ask("junk") == "ok"
        views = ("variable", "line")
        times: dict[str, dict[str, list[float]]] = {by: {n: [] for n in kernels} for by in views}
        for by in views:
            for k in kernels.values():  # warm
                k.who(by)
        # Round by round, each view of each version in turn: a host's speed drifts within
        # minutes, and both views and both versions then see the same drift.
        for _ in range(a.rounds):
            for by in views:
                for name, k in kernels.items():
                    ms, blocks = k.who(by)
                    assert blocks == 10_000, (name, blocks)
                    times[by][name].append(ms)
        for by in views:
            row = {}
            for name, ts in times[by].items():
                q = statistics.quantiles(ts, n=4)
                row[name] = {"median_ms": statistics.median(ts), "q1_ms": q[0], "q3_ms": q[2]}
            out.setdefault(case, {})[by] = row
            print(
                f"{case:<28} by {by:<9}"
                + "".join(
                    f"  {n} {r['median_ms']:6.1f} ms ({r['q1_ms']:.1f}-{r['q3_ms']:.1f})"
                    for n, r in row.items()
                )
            )
    for k in kernels.values():
        k.p.kill()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
