"""Panel costs, through a real kernel (jupyter_client):

1. step time of a small training loop with the panel streaming at the default rate
   (500 ms) versus no panel: target under 1 % slower;
2. round trip of an action (`sample`, `empty_cache`) while a cell runs: target p95 < 100 ms.

    python3 benchmarks/bench_panel.py [--json out.json]

On a machine without a GPU the loop runs on the CPU (numbers then say little).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.test_kernel_protocol import Listener, start_kernel, stop_kernel, wait_execute

SETUP = """
%load_ext jupyter_gpumem
import time, torch
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                            torch.nn.Linear(2048, 2048)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
xb = torch.randn(512, 2048, device=dev)
def steps(seconds):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        model(xb).square().mean().backward(); opt.step(); opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        n += 1
    return (time.perf_counter() - t0) / n * 1e3
steps(2)
"""


def step_ms(kc, listener, seconds: float) -> float:
    msg_id = kc.execute(f"print(steps({seconds}))")
    out = None
    deadline = time.monotonic() + seconds + 30
    while time.monotonic() < deadline:
        for _, m in list(listener.iopub):
            if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
                out = float(m["content"]["text"].strip())
        if out is not None:
            break
        time.sleep(0.05)
    kc.get_shell_msg(timeout=30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    km, kc = start_kernel({})
    listener = Listener(kc)
    try:
        assert wait_execute(kc, SETUP, timeout=120)["content"]["status"] == "ok"
        off, on = [], []
        for _ in range(args.rounds):  # interleaved rounds, so drift hits both alike
            listener.request("unsubscribe", client="bench")
            off.append(step_ms(kc, listener, args.seconds))
            listener.request("subscribe", interval_ms=500, client="bench")
            on.append(step_ms(kc, listener, args.seconds))
        listener.request("unsubscribe", client="bench")
        # round trips while a cell runs
        msg_id = kc.execute("steps(12)")
        time.sleep(1)
        rtts = {"sample": [], "empty_cache": []}
        t_end = time.monotonic() + 9
        while time.monotonic() < t_end:
            for action in rtts:
                _, content, rtt, _ = listener.request(action)
                assert content is not None, f"no reply to {action}"  # refused counts too
                rtts[action].append(rtt * 1e3)
                time.sleep(0.05)
        kc.get_shell_msg(timeout=30)
        _ = msg_id
    finally:
        stop_kernel(km, kc, listener)
    med_off, med_on = statistics.median(off), statistics.median(on)
    # Rounds drift by several percent; each panel round is compared with the round before it.
    paired = [(b / a - 1) * 100 for a, b in zip(off, on, strict=True)]
    result = {
        "step_ms_no_panel": off,
        "step_ms_panel_500ms": on,
        "slowdown_percent": statistics.median(paired),
        "slowdown_percent_rounds": paired,
        "rtt_ms": {
            a: {
                "p50": statistics.median(v),
                "p95": sorted(v)[int(0.95 * (len(v) - 1))],
                "n": len(v),
            }
            for a, v in rtts.items()
        },
    }
    spread = f"{min(paired):+.1f} .. {max(paired):+.1f} %"
    print(
        f"training step: {med_off:.3f} ms without panel, {med_on:.3f} ms with panel streaming "
        f"at 500 ms: {result['slowdown_percent']:+.2f} % (median of {len(paired)} paired "
        f"rounds; spread {spread})"
    )
    for a, r in result["rtt_ms"].items():
        print(
            f"action {a!r} while a cell runs: p50 {r['p50']:.1f} ms, p95 {r['p95']:.1f} ms "
            f"(n={r['n']})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
