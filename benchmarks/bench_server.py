"""The server extension under load: `GET /api/gpumem/devices` with 8 GPUs and 50 processes,
and how long the server's event loop is blocked while `/metrics` is scraped every second.

    python3 benchmarks/bench_server.py [--json out.json] [--latency-ms 0.5]

NVML is replaced at its call boundary (JUPYTER_GPUMEM_FAKE_NVML) by 8 GPUs with 50 compute
processes (real PIDs of this machine: this process and its children), each NVML call taking
``--latency-ms`` (a driver under load answers in tens to hundreds of microseconds). The
server runs in this process, so a timer on its own event loop measures how late it fires:
the time the loop was blocked.
Targets: the endpoint under 50 ms; the loop blocked under 1 ms while scraped every second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from jupyter_gpumem.testing.fake_nvml import env as fake_nvml_env

GiB = 1 << 30


def fake_nvml(path: str, pids: list[int], latency_ms: float) -> None:
    devices = []
    for d in range(8):
        procs = [
            {"pid": pid, "used": GiB, "name": "python"}
            for i, pid in enumerate(pids)
            if i % 8 == d or d == 0
        ]
        uuid = f"GPU-{d:08d}-0000-0000-0000-000000000000"
        devices.append(
            {
                "name": "NVIDIA H200",
                "uuid": uuid,
                "total": 150 * GiB,
                "used": len(procs) * GiB,
                "processes": procs,
            }
        )
    with open(path, "w") as f:
        json.dump({"driver": "fake", "latency_ms": latency_ms, "devices": devices}, f)


CLIENT = r"""
import json, statistics, sys, time, urllib.request

url, token, seconds, devices = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"
headers = {"Authorization": f"token {token}"}
def get(path):
    req = urllib.request.Request(url + path, headers=headers)
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    return (time.perf_counter() - t0) * 1000
out = {}
time.sleep(1.0)
if devices:
    fresh = []
    for _ in range(10):
        time.sleep(1.05)  # past the 1 s cache: every request reads NVML again
        fresh.append(get("api/gpumem/devices"))
    cached = [get("api/gpumem/devices") for _ in range(20)]
    out["devices_endpoint_ms"] = {"fresh reading p50": statistics.median(fresh),
                                  "fresh reading max": max(fresh),
                                  "cached p50": statistics.median(cached)}
print("SCRAPING", flush=True)
scrape = []
end = time.monotonic() + seconds
while time.monotonic() < end:
    scrape.append(get("metrics"))
    time.sleep(1.0)
out["metrics_scrape_ms_p50"] = statistics.median(scrape)
print(json.dumps(out), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--latency-ms", type=float, default=0.05)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--without", action="store_true", help="the server without jupyter_gpumem")
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"]) for _ in range(49)
    ]
    pids = [os.getpid(), *(p.pid for p in sleepers)]
    nvml = os.path.join(work, "nvml.json")
    fake_nvml(nvml, pids, args.latency_ms)
    os.environ.update(fake_nvml_env(nvml))
    from jupyter_server.serverapp import ServerApp
    from tornado.ioloop import PeriodicCallback

    token = "bench"
    app = ServerApp(jpserver_extensions={} if args.without else {"jupyter_gpumem": True})
    app.initialize(
        [
            "--no-browser",
            "--allow-root",
            "--port=0",
            f"--ServerApp.root_dir={work}",
            f"--IdentityProvider.token={token}",
            "--ServerApp.log_level=WARN",
        ],
        find_extensions=False,
    )
    url = f"http://127.0.0.1:{app.port}/"
    lags: list[float] = []
    state = {"last": 0.0, "on": False}
    period = 0.005

    def tick() -> None:  # how late the loop runs a 5 ms timer: the time it was blocked
        now = time.perf_counter()
        if state["on"] and state["last"]:
            lags.append(max(0.0, now - state["last"] - period))
        state["last"] = now

    results: dict = {
        "server": "without jupyter_gpumem" if args.without else "with jupyter_gpumem",
        "latency_ms_per_nvml_call": args.latency_ms,
        "gpus": 8,
        "processes": 50,
    }

    def client() -> None:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CLIENT,
                url,
                token,
                str(args.seconds),
                "0" if args.without else "1",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("SCRAPING"):
                state["on"] = True
            elif line.startswith("{"):
                results.update(json.loads(line))
        state["on"] = False
        if not args.without:  # what one scrape runs on the loop for us: serve the reading
            from jupyter_gpumem.server.metrics import _REGISTERED

            collector = _REGISTERED[0]
            times = []
            for _ in range(200):
                t0 = time.perf_counter()
                list(collector.collect())
                times.append((time.perf_counter() - t0) * 1000)
            results["collect_on_loop_ms"] = {"p50": sorted(times)[100], "max": max(times)}
        blocked = sorted(lags)
        results["loop_blocked_ms"] = {
            "timer fires": len(blocked),
            "p50": 1000 * blocked[len(blocked) // 2],
            "p99": 1000 * blocked[int(len(blocked) * 0.99)],
            "max": 1000 * blocked[-1],
        }
        app.io_loop.add_callback(app.io_loop.stop)

    PeriodicCallback(tick, period * 1000).start()
    threading.Thread(target=client, daemon=True).start()
    app.start()
    for p in sleepers:
        p.kill()
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
