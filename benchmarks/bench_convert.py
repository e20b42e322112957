"""Time ``protocol.to_protocol`` on what the kernel converts most often: a panel sample
(a Measurement with one device, every 0.5 s) and a cell's marker (every cell).

    PYTHONPATH=. python benchmarks/bench_convert.py
"""

from __future__ import annotations

import timeit

from jupyter_gpumem.protocol.convert import to_protocol
from tests.protocol_samples import cell, history_row, measurement


def main() -> None:
    cases = {
        "Measurement, 1 device": measurement(1, full=False),
        "Measurement, 1 device, worker, replay": measurement(1),
        "CellReport": cell(),
        "HistoryRow": history_row(),
    }
    for name, record in cases.items():
        n = 20000
        best = min(timeit.repeat(lambda r=record: to_protocol(r), number=n, repeat=7)) / n
        print(f"{name:40s} {best * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
