"""Where a scan's answer meets the card: for each batch around the edge, the dry run's need
in the notebook workflow against the real fresh process's need (no cap) and whether a real
run under the card's cap runs out. One JSON line per batch.

    python3 benchmarks/probes/probe_scan_edge.py resnet50_adamw 170 171 172 173 174 175

Each side runs in a fresh process (``tests/gpu/notebook_cases.py --one``), all batches at
once: the figures are per process, so the runs do not disturb each other's.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.gpu import notebook_cases as nc  # noqa: E402


def main() -> None:
    name, batches = sys.argv[1], [int(b) for b in sys.argv[2:]]
    card = nc.CASES[name][3]
    cap = nc.cap_of(card)
    before = nc._device_used()
    jobs = []
    with ThreadPoolExecutor(max_workers=int(os.environ.get("PROBE_WORKERS", "6"))) as pool:
        for b in batches:
            jobs.append((
                b,
                pool.submit(nc.one, "real", name, str(b), "", str(before)),
                pool.submit(nc.one, "real", name, str(b), str(cap), str(before)),
                pool.submit(nc.one, "predicted", name, str(b)),
            ))  # fmt: skip
        for b, free, capped, dry in jobs:
            f, c, d = free.result(), capped.result(), dry.result()
            print(json.dumps({
                "case": name, "card": card, "cap": cap, "batch": b,
                "real_need": f.get("need"), "real_peak_reserved": f.get("peak_reserved"),
                "real_peak_allocated": f.get("peak_allocated"), "real_beside": f.get("beside"),
                "capped_out_of_memory": c.get("out_of_memory"),
                "capped_peak_reserved": c.get("peak_reserved"),
                "dry_need": d.get("need"), "dry_peak_reserved": d.get("peak_reserved"),
                "dry_peak_allocated": d.get("peak_allocated"), "dry_held": d.get("held"),
                "dry_outside": d.get("outside"),
                "errors": [x["error"][-600:] for x in (f, c, d) if "error" in x],
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
