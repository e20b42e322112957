"""Write the cost tables of benchmarks/README.md and README.md from benchmarks/results/.

    python3 benchmarks/tables.py           # print the tables
    python3 benchmarks/tables.py --write   # put them between the markers of both files
    python3 benchmarks/tables.py --check   # exit 1 when a file differs from its results

Each table names the result files it reads; a figure never comes from anywhere else.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOT = HERE.parent

# The per-cell cost of the current code: A/B runs on H200 hosts, each five rounds
# of every configuration interleaved with its own bare cells (bench_cell_overhead.py --base).
CELL_RUNS = [
    "h200-cell-overhead-2026-11-25a.json",
    "h200-cell-overhead-2026-11-25b.json",
    "h200-cell-overhead-2026-11-26a.json",
    "h200-cell-overhead.json",
]
PEERS = "h200-cell-overhead-peers.json"  # the peers, measured with the same benchmark on an H200
WHO = "h200-who.json"
VIEWS = "h200-views.json"
SERVER = "h200-server.json"
PANEL = "h200-panel.json"
BROWSER = "chromium-panel-update.json"
ATTRIBUTION = "h200-attribution.json"
PLANNING = "h100-planning-overhead.json"

CONFIGS = [
    ("%%gpumem", "`%%gpumem` (full report)"),
    ("%%gpumem -q", "`%%gpumem -q` (history only)"),
    ("auto mode", "auto mode (one line a cell)"),
    ("reads alone (floor)", "the readings alone (floor)"),
]


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def ms(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def span(values: list[float], digits: int = 3) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def cell_table() -> str:
    runs = [load(n) for n in CELL_RUNS]
    rows = [
        (
            "| configuration | trivial cell: added ms (median of rounds; rounds' range) | "
            "training step: added ms | bare cell |"
        ),
        "| --- | --- | --- | --- |",
    ]
    for key, label in CONFIGS:
        triv = [r["cells"]["trivial"][key] for r in runs]
        step = [r["cells"]["train step"][key] for r in runs]
        rows.append(
            f"| {label} | "
            + " / ".join(f"+{ms(t['added_ms'])} ({span(t['rounds_added_ms'])})" for t in triv)
            + " | "
            + " / ".join(f"+{ms(s['added_ms'])}" for s in step)
            + " | "
            + " / ".join(ms(t["bare_ms"]) for t in triv)
            + " |"
        )
    rows.append("")
    rows.append(
        f"{len(runs)} runs on H200 hosts (" + ", ".join(f"`{n}`" for n in CELL_RUNS) + "); each "
        "figure is the median over five rounds of the time a cell takes with the "
        "configuration minus the same process's bare cell. The floor reads the allocator's "
        "counters and the device's free memory before and after the cell and resets the "
        "peak, with none of the tool's code: no exact measurement can cost less."
    )
    return "\n".join(rows)


def peers_table() -> str:
    d = load(PEERS)["cells"]
    rows = [
        "| per cell added | trivial cell | training step |",
        "| --- | --- | --- |",
    ]
    for key in (
        "%%gpumem",
        "%%gpumem -q",
        "auto mode",
        "ipyexperiments CellLogger",
        "ipython_memory_usage",
    ):
        t, s = d["trivial"][key], d["train step"][key]
        rows.append(f"| {key} | +{ms(t['added_ms'])} ms | +{ms(s['added_ms'])} ms |")
    rows.append("")
    rows.append(
        f"One run on an H200 (`{PEERS}`), bare cells "
        f"{ms(d['trivial']['bare process']['median_ms'])} ms and "
        f"{ms(d['train step']['bare process']['median_ms'], 2)} ms. ipyexperiments calls "
        "`gc.collect()` and `empty_cache()` after every cell and samples NVML from a "
        "thread; ipython_memory_usage samples the process's RSS every millisecond."
    )
    return "\n".join(rows)


def who_table() -> str:
    d = load(WHO)
    rows = ["| namespace | by variable: median (quartiles) | by line |", "| --- | --- | --- |"]
    for case, views in d.items():
        v, line = views["variable"]["new"], views["line"]["new"]
        rows.append(
            f"| {case} | {ms(v['median_ms'], 1)} ms ({ms(v['q1_ms'], 1)}-{ms(v['q3_ms'], 1)}) "
            f"| {ms(line['median_ms'], 1)} ms ({ms(line['q1_ms'], 1)}-"
            f"{ms(line['q3_ms'], 1)}) |"
        )
    a = load(ATTRIBUTION)
    steps = a["steps"]
    rows.append("")
    rows.append(
        f"`%gpumem who` on an H200 (`{WHO}`, rounds alternating with the code before it). "
        "Tracking (`%gpumem track on`) costs PyTorch "
        f"{a['pair_us']['state/state'] - a['pair_us']['None']:.1f} µs more per allocation "
        f"and free: a small MLP step {steps['small MLP step']['slower_pct']:.1f} % slower, "
        f"a transformer step {steps['transformer step']['slower_pct']:.2f} % (`{ATTRIBUTION}`)."
    )
    return "\n".join(rows)


def views_table() -> str:
    v, s = load(VIEWS), load(SERVER)
    seg = v["segments"]["10000 tensors"]
    tr = v["trace_cell"]
    p, b = load(PANEL), load(BROWSER)
    rows = ["| what | cost | result file |", "| --- | --- | --- |"]
    rows.append(
        f"| `%gpumem segments`, {seg['blocks']} blocks in {seg['segments']} segments | "
        f"{ms(seg['snapshot+map+svg_ms'], 0)} ms ({ms(seg['all segments drawn (--all)_ms'], 0)}"
        f" ms with `--all`) | `{VIEWS}` |"
    )
    rows.append(
        f"| `%%gpumem --trace`, a cell of {tr['events']} allocations | "
        f"{ms(tr['cell_traced_ms'], 0)} ms instead of {ms(tr['cell_plain_ms'], 0)} ms | "
        f"`{VIEWS}` |"
    )
    rows.append(
        f"| the panel streaming every 500 ms, beside a training step | "
        f"{p['slowdown_percent']:+.1f} % (median of "
        f"{len(p['slowdown_percent_rounds'])} paired rounds) | `{PANEL}` |"
    )
    rows.append(
        f"| a panel button while a cell runs (`sample`, `empty_cache`) | "
        f"p50 {ms(p['rtt_ms']['sample']['p50'], 1)} / "
        f"{ms(p['rtt_ms']['empty_cache']['p50'], 1)} ms | `{PANEL}` |"
    )
    rows.append(
        f"| one panel update, {b['devices']} GPUs, in Chromium (2 cores), style and layout "
        f"included | p50 {b['with_layout_ms']['p50']} ms, p95 {b['with_layout_ms']['p95']} ms"
        f" | `{BROWSER}` |"
    )
    dev = s["devices_endpoint_ms"]
    rows.append(
        f"| `GET /api/gpumem/devices`, {s['gpus']} GPUs, {s['processes']} processes | "
        f"p50 {ms(dev['fresh reading p50'], 1)} ms fresh, {ms(dev['cached p50'], 1)} ms "
        f"cached; the server's loop blocked p99 {ms(s['loop_blocked_ms']['p99'], 2)} ms | "
        f"`{SERVER}` |"
    )
    return "\n".join(rows)


def planning_table() -> str:
    d = load(PLANNING)["steps"]
    rows = [
        "| step | bare | `%%gpumem` | `--breakdown` | MemTracker's share of the peak |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, s in d.items():
        m = s["ms"]
        rows.append(
            f"| {name} | {ms(m['bare'], 1)} ms | {ms(m['%%gpumem'], 1)} ms | "
            f"{ms(m['%%gpumem --breakdown'], 1)} ms ({s['breakdown_over_bare']:.2f}x) | "
            f"{100 * s['memtracker']['share']:.1f} % (the breakdown: 100 %) |"
        )
    rows.append("")
    rows.append(f"On an H100 (`{PLANNING}`), medians.")
    return "\n".join(rows)


def readme_table() -> str:
    """The short table of README.md: what it costs against its peers."""
    runs = [load(n) for n in CELL_RUNS]
    peers = load(PEERS)["cells"]["trivial"]
    who = load(WHO)["10k tensors + 100k objects"]["variable"]["new"]

    def added(key: str) -> str:
        values = [r["cells"]["trivial"][key]["added_ms"] for r in runs]
        return (
            f"+{span(values, 2)} ms"
            if max(values) - min(values) >= 0.005
            else (f"+{ms(values[0], 2)} ms")
        )

    rows = [
        "| tool | added to every cell | what it gives |",
        "| --- | --- | --- |",
        (
            f"| `%%gpumem` | {added('%%gpumem')} | exact allocated, reserved and peak; outside "
            "PyTorch; cudaMalloc calls; fragmentation; hints |"
        ),
        (
            f"| `%%gpumem -q` / auto mode | {added('%%gpumem -q')} / {added('auto mode')} | the "
            "same figures in the history / one line a cell |"
        ),
        (
            "| ipyexperiments CellLogger | "
            f"+{ms(peers['ipyexperiments CellLogger']['added_ms'], 0)} ms | "
            "NVML figures after `gc.collect()` + `empty_cache()` (changes your program); a "
            "sampled peak |"
        ),
        (
            f"| ipython_memory_usage | +{ms(peers['ipython_memory_usage']['added_ms'], 0)} ms | "
            "host RSS sampled every millisecond |"
        ),
        (
            "| nvidia-smi, jupyterlab-nvdashboard | outside the kernel | whole-device NVML "
            "figures: no allocated vs reserved, no peaks, no owners |"
        ),
        "",
        (
            f"Measured on H200s with torch 2.11 (`benchmarks/results/`); `%gpumem who` takes "
            f"{ms(who['median_ms'], 0)} ms for 10,000 tensors beside 100,000 other objects. How "
            "each figure was measured, with its spread: [benchmarks/README.md]"
            "(benchmarks/README.md)."
        ),
    ]
    return "\n".join(rows)


TABLES = {
    "cell": cell_table,
    "peers": peers_table,
    "who": who_table,
    "views": views_table,
    "planning": planning_table,
}


def fill(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- table:{name} -->\n)(?:.*?\n)?(<!-- /table:{name} -->)", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"marker <!-- table:{name} --> missing")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def rendered() -> dict[Path, str]:
    out = {}
    bench = HERE / "README.md"
    text = bench.read_text()
    for name, make in TABLES.items():
        text = fill(text, name, make())
    out[bench] = text
    readme = ROOT / "README.md"
    out[readme] = fill(readme.read_text(), "cost", readme_table())
    return out


def main(argv: list[str]) -> int:
    if "--write" in argv or "--check" in argv:
        stale = []
        for path, text in rendered().items():
            if path.read_text() != text:
                stale.append(path)
                if "--write" in argv:
                    path.write_text(text)
        if "--check" in argv and stale:
            print(
                "stale tables (python3 benchmarks/tables.py --write):",
                ", ".join(str(p.relative_to(ROOT)) for p in stale),
            )
            return 1
        return 0
    for name, make in {**TABLES, "cost (README)": readme_table}.items():
        print(f"## {name}\n\n{make()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
