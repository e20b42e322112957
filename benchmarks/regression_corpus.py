"""Does `jupyter-gpumem run --baseline` catch memory regressions, and name their causes?

On a machine with a CUDA GPU, for each family of ``regression_cases.py`` (ResNet-18,
GPT-2, BERT, an LSTM tagger, PyTorch's transformer-encoder tutorial model):

1. the notebook is saved as the baseline: ``run base.ipynb --save base.json
   --breakdown-all --repeat R`` (R runs, each in a fresh kernel, measure the reserved
   spread);
2. each regression (one cell's code edited) runs once against it: ``run v.ipynb --baseline
   base.json --breakdown-all``. It is *caught* when the run exits 1 and every target cell
   is a regression of its own (not only carried from an earlier cell); it is *named right*
   when the largest change of the expected kind (category, module or kept line) is the
   expected one;
3. the unchanged notebook runs N more times against its baseline: no exact figure may
   raise an alarm; every reserved figure's spread over all the runs is reported.

Runs go in ``--jobs`` processes at once (the counters are per process; the GPU is shared).
Writes ``OUT/corpus.jsonl`` (one line per regression and per identical run) and
``OUT/summary.txt``; prints the summary.

``--cpu`` runs the notebooks on the CPU (no figures) to check that their code runs, on a
machine without a GPU. ``--judge`` runs nothing: it judges the documents an earlier run
left in OUT again (the comparison is pure Python on them), with this version's code.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from regression_cases import FAMILIES, REGRESSIONS, Regression, edited

from jupyter_gpumem.analysis.run_diff import compare
from jupyter_gpumem.analysis.run_documents import parse_tolerance
from jupyter_gpumem.units import format_bytes

TOLERANCE = "1%"


def on_cpu(source: str) -> str:
    for old, new in (
        ("print(torch.cuda.get_device_name(0))", "pass"),
        ('"cuda"', '"cpu"'),
        (".cuda()", ""),
    ):
        source = source.replace(old, new)
    return source


def write_notebook(path: Path, cells: list[str], cpu: bool) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(on_cpu(c) if cpu else c) for c in cells]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def gpumem(*args: str | Path, log: Path) -> tuple[int, float]:
    """``python -m jupyter_gpumem ARGS``: its exit code and seconds; stdout+stderr in log."""
    t = time.monotonic()
    with log.open("w") as out:
        p = subprocess.run(
            [sys.executable, "-m", "jupyter_gpumem", *map(str, args)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    return p.returncode, time.monotonic() - t


def load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_peak(doc: dict[str, Any]) -> int:
    return max(
        (d.get("peak") or 0 for c in doc["cells"] for d in c["devices"] if d.get("index") == 0),
        default=0,
    )


# -- judging one regression -----------------------------------------------------------------
def top(why: Any, kinds: tuple[str, ...]) -> str | None:
    for w in why:
        if w.kind in kinds and w.change > 0:
            return str(w.name)
    return None


def named(why: Any, expect: tuple[str, object]) -> tuple[bool, str | None]:
    kind, wanted = expect
    if kind == "category":
        name = top(why, ("category",))
        return name in wanted, name  # type: ignore[operator]
    if kind == "module":
        name = top(why, ("module",))
        return name is not None and str(wanted) in name, name
    name = top(why, ("line", "new_line"))
    return name is not None and str(wanted) in name, name


def judge_regression(
    r: Regression, base: dict[str, Any], after: dict[str, Any], code: int
) -> dict[str, Any]:
    diff = compare(base, after, parse_tolerance(TOLERANCE), ("base.json", "this run"))
    peak = run_peak(base)
    cells: dict[int, Any] = {c.after.index: c for c in diff.cells if c.after is not None}
    largest = 0
    for c in diff.cells:
        for _, f in c.regressions:
            if f.judged == "exact" and not f.inherited and f.own is not None:
                largest = max(largest, f.own)
    targets = []
    for index, expects in r.targets.items():
        c = cells.get(index)
        own = [(d, f) for d, f in (c.regressions if c else ()) if not f.inherited]
        why = own[0][0].why if own else ()
        checks = [(e[0], *named(why, e)) for e in expects]
        targets.append(
            {
                "cell": index,
                "caught": bool(own),
                "figures": sorted({f.figure for _, f in own}),
                "own": max((f.own or 0 for _, f in own), default=0),
                "checks": [
                    {
                        "kind": k,
                        "ok": ok,
                        "named": n,
                        "expected": sorted(e[1]) if isinstance(e[1], frozenset) else e[1],
                    }
                    for (k, ok, n), e in zip(checks, expects, strict=True)
                ],
                "why": [[w.kind, w.name, w.before, w.after] for w in why],
            }
        )
    caught = code == 1 and all(t["caught"] for t in targets)
    return {
        "kind": "regression",
        "name": r.name,
        "family": r.family,
        "what": r.what,
        "exit_code": code,
        "caught": caught,
        "named_right": caught and all(c["ok"] for t in targets for c in t["checks"]),
        "base_peak": peak,
        "after_peak": run_peak(after),
        "largest_own_growth": largest,
        "largest_own_growth_pct": round(100 * largest / peak, 2) if peak else None,
        "regressions": [
            f"{c.ref.label} {d.device} {f.figure} {f.before}->{f.after} ({f.judged})"
            for c, d, f in diff.regressions
        ],
        "targets": targets,
    }


def judge_identical(
    family: str, k: int, base: dict[str, Any], after: dict[str, Any], code: int
) -> dict[str, Any]:
    diff = compare(base, after, parse_tolerance(TOLERANCE), ("base.json", "this run"))
    alarms = [(c, d, f) for c, d, f in diff.regressions] + [
        (None, d, f) for d, f in diff.run_regressions
    ]
    return {
        "kind": "identical",
        "family": family,
        "run": k,
        "exit_code": code,
        "exact_alarms": [
            f"{c.ref.label if c else 'run'} {f.figure}" for c, _, f in alarms if f.judged == "exact"
        ],
        "reserved_alarms": [
            f"{c.ref.label if c else 'run'} {f.figure} {f.before}->{f.after}"
            for c, _, f in alarms
            if f.judged != "exact"
        ],
    }


def spreads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell and reserved figure: lowest and highest over all the runs."""
    out = []
    for i, cell in enumerate(docs[0]["cells"]):
        for figure in ("reserved", "peak_reserved", "peak", "kept"):
            values = [
                d.get(figure)
                for doc in docs
                for d in doc["cells"][i]["devices"]
                if d.get("index") == 0 and d.get(figure) is not None
            ]
            if values:
                lo, hi = min(values), max(values)
                out.append(
                    {
                        "cell": i,
                        "first_line": cell["first_line"],
                        "figure": figure,
                        "runs": len(values),
                        "low": lo,
                        "high": hi,
                        "spread_pct": round(100 * (hi - lo) / hi, 3) if hi else 0.0,
                    }
                )
    return out


# -- the corpus -------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--families", nargs="*", default=list(FAMILIES))
    p.add_argument("--repeat", type=int, default=3, help="runs of each baseline (its spread)")
    p.add_argument("--identical", type=int, default=20, help="identical runs against the baseline")
    p.add_argument("--identical-families", nargs="*", default=["resnet18", "gpt2"])
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--cpu", action="store_true", help="no GPU: check that the notebooks run")
    p.add_argument("--judge", action="store_true", help="run nothing: judge OUT's documents")
    args = p.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    families = [f for f in args.families if f in FAMILIES]
    regressions = [r for r in REGRESSIONS if r.family in families]
    t0 = time.monotonic()
    extra = [] if args.cpu else ["--breakdown-all"]

    def save(family: str) -> tuple[str, int, float]:
        nb = write_notebook(out / family / "base.ipynb", FAMILIES[family], args.cpu)
        code, s = gpumem(
            "run",
            nb,
            "--save",
            out / family / "base.json",
            "--repeat",
            str(args.repeat),
            "--force",
            *extra,
            log=out / family / "base.log",
        )
        return family, code, s

    if args.judge:
        save = variant = same = None  # type: ignore[assignment]
        ran, repeated = recorded(out, regressions, families, args.identical_families)
        return report(out, args, ran, repeated, t0)
    with ThreadPoolExecutor(args.jobs) as pool:
        saved = list(pool.map(save, families))
    for family, code, s in saved:
        print(f"baseline {family}: exit {code} in {s:.0f} s", flush=True)

    def variant(r: Regression) -> tuple[Regression, int, float]:
        nb = write_notebook(
            out / r.family / f"{r.name}.ipynb", edited(FAMILIES[r.family], r.edits), args.cpu
        )
        code, s = gpumem(
            "run",
            nb,
            "--baseline",
            out / r.family / "base.json",
            "--json",
            out / r.family / f"{r.name}.json",
            "--markdown",
            out / r.family / f"{r.name}.md",
            "--force",
            *extra,
            log=out / r.family / f"{r.name}.txt",
        )
        return r, code, s

    def same(job: tuple[str, int]) -> tuple[str, int, int, float]:
        family, k = job
        nb = out / family / "base.ipynb"
        code, s = gpumem(
            "run",
            nb,
            "--baseline",
            out / family / "base.json",
            "--json",
            out / family / f"same-{k}.json",
            "--force",
            *extra,
            log=out / family / f"same-{k}.txt",
        )
        return family, k, code, s

    jobs = [(f, k) for f in args.identical_families if f in families for k in range(args.identical)]
    with ThreadPoolExecutor(args.jobs) as pool:
        ran = list(pool.map(variant, regressions))
        repeated = list(pool.map(same, jobs))
    return report(out, args, ran, repeated, t0)


def recorded(
    out: Path, regressions: list[Regression], families: list[str], identical: list[str]
) -> tuple[list[tuple[Regression, int, float]], list[tuple[str, int, int, float]]]:
    """What an earlier run left in OUT, as the runs return it (exit codes from the
    documents, no times)."""

    def code(path: Path) -> int:
        doc = load(path)
        return int(doc["summary"]["exit_code"]) if doc else 2

    ran = [(r, code(out / r.family / f"{r.name}.json"), 0.0) for r in regressions]
    repeated = []
    for family in (f for f in identical if f in families):
        for path in sorted((out / family).glob("same-*.json")):
            k = int(path.stem.split("-")[1])
            repeated.append((family, k, code(path), 0.0))
    return ran, repeated


def report(
    out: Path,
    args: argparse.Namespace,
    ran: list[tuple[Regression, int, float]],
    repeated: list[tuple[str, int, int, float]],
    t0: float,
) -> int:
    rows: list[dict[str, Any]] = []
    for r, code, s in ran:
        base, after = load(out / r.family / "base.json"), load(out / r.family / f"{r.name}.json")
        if base is None or after is None:
            rows.append(
                {
                    "kind": "regression",
                    "name": r.name,
                    "family": r.family,
                    "exit_code": code,
                    "error": "no document",
                }
            )
            continue
        row = (
            judge_regression(r, base, after, code)
            if not args.cpu
            else {
                "kind": "regression",
                "name": r.name,
                "family": r.family,
                "exit_code": code,
                "statuses": [c["status"] for c in after["cells"]],
            }
        )
        row["seconds"] = round(s, 1)
        rows.append(row)
    by_family: dict[str, list[dict[str, Any]]] = {}
    for family, k, code, s in repeated:
        base, after = load(out / family / "base.json"), load(out / family / f"same-{k}.json")
        if base is None or after is None:
            rows.append(
                {
                    "kind": "identical",
                    "family": family,
                    "run": k,
                    "exit_code": code,
                    "error": "no document",
                }
            )
            continue
        row = judge_identical(family, k, base, after, code)
        row["seconds"] = round(s, 1)
        rows.append(row)
        by_family.setdefault(family, [base]).append(after)
    for family, docs in by_family.items():
        rows.append(
            {
                "kind": "spread",
                "family": family,
                "runs": len(docs),
                "figures": spreads(docs),
                "saved_spread": [
                    {"cell": i, "spread": d.get("spread")}
                    for i, c in enumerate(docs[0]["cells"])
                    for d in c["devices"]
                    if d.get("index") == 0 and d.get("spread")
                ],
            }
        )
    with (out / "corpus.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
    text = summary(rows, time.monotonic() - t0)
    (out / "summary.txt").write_text(text)
    print(text)
    return 0


def summary(rows: list[dict[str, Any]], seconds: float) -> str:
    lines = []
    regs = [r for r in rows if r["kind"] == "regression"]
    for r in regs:
        if "caught" not in r:
            lines.append(
                f"{r['name']:26} exit {r['exit_code']} {r.get('statuses') or r.get('error')}"
            )
            continue
        checks = "; ".join(
            f"cell {t['cell']}: "
            + ", ".join(
                f"{c['kind']} {'OK' if c['ok'] else 'WRONG'} ({c['named']})" for c in t["checks"]
            )
            for t in r["targets"]
        )
        lines.append(
            f"{r['name']:26} exit {r['exit_code']} caught={r['caught']} named={r['named_right']} "
            f"largest own growth {format_bytes(r['largest_own_growth'])} "
            f"({r['largest_own_growth_pct']}% of the peak {format_bytes(r['base_peak'])}); {checks}"
        )
    judged = [r for r in regs if "caught" in r]
    big = [r for r in judged if (r["largest_own_growth_pct"] or 0) >= 1.0]
    if judged:
        lines.append(
            f"caught: {sum(r['caught'] for r in big)} of {len(big)} regressions of 1% or "
            f"more of the peak ({sum(r['caught'] for r in judged)} of {len(judged)} in all); "
            f"named right: {sum(r['named_right'] for r in judged)} of {len(judged)}"
        )
    same = [r for r in rows if r["kind"] == "identical"]
    if same:
        exact = sum(len(r.get("exact_alarms", [])) for r in same)
        reserved = sum(len(r.get("reserved_alarms", [])) for r in same)
        codes = sorted({r["exit_code"] for r in same})
        lines.append(
            f"identical runs: {len(same)}, exit codes {codes}, alarms on exact figures: "
            f"{exact}, on reserved figures: {reserved}"
        )
    for s in (r for r in rows if r["kind"] == "spread"):
        parts = []
        for figure in ("reserved", "peak_reserved", "peak", "kept"):
            rows_ = [f for f in s["figures"] if f["figure"] == figure]
            moved = [f for f in rows_ if f["high"] != f["low"]]
            if not moved:
                parts.append(f"{figure}: the same bytes in all {len(rows_)} cells")
                continue
            w = max(moved, key=lambda f: f["spread_pct"])
            parts.append(
                f"{figure}: {len(moved)} of {len(rows_)} cells moved, at most {w['spread_pct']}% "
                f"(cell {w['cell']}, {format_bytes(w['low'])}..{format_bytes(w['high'])})"
            )
        lines.append(f"spread over {s['runs']} runs of {s['family']}: " + "; ".join(parts))
    lines.append(f"{seconds:.0f} s in all")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
