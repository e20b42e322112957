"""Worker processes on two GPUs: each rank's own allocator in the cell's report, exactly.

A notebook cell forks two ranks (``torch.multiprocessing.start_processes(...,
start_method="fork")``, what accelerate's ``notebook_launcher`` does); rank r keeps
(r+1) GiB on cuda:r and peaks at (r+3) GiB. The report must show both, to the byte, and
the kernel must never have started CUDA (a fork launch requires it).

Each case runs in a fresh interpreter: the test process itself has CUDA up (other GPU
tests), and a forked child of such a process cannot use CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
    ),
]
GiB = 1 << 30

SHELL = textwrap.dedent(
    """
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    CELL = '''%%gpumem -o rep
    import os, torch
    import torch.multiprocessing as tmp
    HELD = []  # what a rank keeps until it exits (its locals go when the function returns)
    def rank(r=None):
        # start_processes passes the index; notebook_launcher sets LOCAL_RANK instead
        r = int(os.environ["LOCAL_RANK"]) if r is None else r
        os.environ["RANK"] = str(r)
        torch.cuda.set_device(r)
        HELD.append(torch.empty((r + 1) << 30, dtype=torch.uint8, device=r))
        step = torch.empty(2 << 30, dtype=torch.uint8, device=r)
        del step
        torch.cuda.synchronize()
    LAUNCH
    '''
    r = ip.run_cell(CELL.replace("LAUNCH", sys.argv[1]))
    assert r.success, r.error_in_exec
    rep = ip.user_ns["rep"]
    from jupyter_gpumem.reporters.text import cell_report_text
    ip.run_line_magic("gpumem", "auto on")
    from IPython.utils.capture import capture_output
    with capture_output() as cap:
        ip.run_cell(CELL.split("\\n", 1)[1].replace("LAUNCH", sys.argv[1]))
    print(json.dumps({
        "cuda_in_kernel": ip.user_ns["torch"].cuda.is_initialized(),
        "workers": [
            [w.rank, w.status, w.started_in_cell, d.index, d.allocated, d.peak_allocated,
             d.reserved, d.peak_exact]
            for w in rep.workers for d in w.devices
        ],
        "text": cell_report_text(rep),
        "auto": [o.data.get("text/plain", "") for o in cap.outputs],
    }))
    """
)


def run_cell(launch: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SHELL, launch],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check(got: dict) -> None:
    assert got["cuda_in_kernel"] is False  # the tool never starts CUDA in the parent
    assert got["workers"] == [
        [0, "exited", True, 0, 1 * GiB, 3 * GiB, got["workers"][0][6], True],
        [1, "exited", True, 1, 2 * GiB, 4 * GiB, got["workers"][1][6], True],
    ]
    for w in got["workers"]:
        assert w[6] >= w[5]  # reserved at exit holds at least the peak (nothing emptied)
    assert "rank 0 (pid " in got["text"] and "peak 4.00 GiB" in got["text"]
    (line,) = got["auto"]
    assert "workers: rank 0 peak 3.00 GiB, rank 1 peak 4.00 GiB" in line


def test_start_processes_fork_two_ranks_exact():
    check(run_cell('tmp.start_processes(rank, nprocs=2, start_method="fork")'))


def test_notebook_launcher_two_ranks_exact():
    pytest.importorskip("accelerate")
    check(
        run_cell(
            "from accelerate import notebook_launcher\n"
            "notebook_launcher(rank, args=(), num_processes=2)"
        )
    )
