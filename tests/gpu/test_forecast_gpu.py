"""A forecast before the OOM on a real GPU: a planted leak, run cell after cell through a
real IPython shell with the extension until the real OutOfMemoryError; the forecast made
after the 3rd and 4th cells must name the cell where the OOM really came within 10 %.

- in the kernel: each cell keeps ``torch.empty(LEAK, dtype=torch.uint8, device='cuda')``
  in a list, under a cap set with ``torch.cuda.set_per_process_memory_fraction``;
- in a worker process a cell forked (the kernel never starts CUDA, as a fork launch
  requires), which keeps one more block per step, each measured cell asking one step, until
  the device is full. Run in a fresh interpreter: the test process has CUDA up, and a
  forked child of such a process cannot use CUDA.

Skipped without CUDA. Run on the GPU machine: ``pytest -m gpu tests/gpu/test_forecast_gpu.py``.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import run

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MiB = 1 << 20
GiB = 1 << 30
LEAK = 64 * MiB  # a multiple of 2 MiB: one segment of exactly that size per cell
ROOM = 4 * GiB  # what the cap leaves above what the kernel holds when the loop starts


@pytest.fixture
def gip(ip):
    ip.run_cell("import torch")
    ip.run_cell("torch.empty(0, device='cuda:0')")  # the context exists before the loop
    ip.run_cell("import gc; gc.collect(); torch.cuda.empty_cache()")
    yield ip
    run(ip, "%gpumem auto off")
    ip.user_ns.pop("keep", None)
    gc.collect()
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    torch.cuda.empty_cache()


def within(predicted: int, actual: int, made_at: int) -> bool:
    """The predicted OOM cell is within 10 % of the real one, counted from the cell the
    forecast was made after (one cell at least: the count is whole)."""
    return abs(predicted - actual) <= max(1.0, 0.1 * (actual - made_at))


def test_a_planted_leak_under_a_cap_is_forecast_within_ten_percent(gip):
    from jupyter_gpumem._ipython import current

    total = torch.cuda.mem_get_info(0)[1]
    fraction = (torch.cuda.memory_reserved(0) + ROOM) / total
    gip.run_cell(f"torch.cuda.set_per_process_memory_fraction({fraction!r}, 0)")
    gip.run_cell("keep = []")
    run(gip, "%gpumem auto on")
    made: dict[int, object] = {}  # loop cell -> its report
    lines: dict[int, str] = {}
    oom_at = None
    for i in range(1, 4 * ROOM // LEAK):
        res, texts, _ = run(
            gip, f"keep.append(torch.empty({LEAK}, dtype=torch.uint8, device='cuda'))"
        )
        if not res.success:
            assert isinstance(res.error_in_exec, torch.OutOfMemoryError), res.error_in_exec
            oom_at = i
            break
        made[i] = current().last_report
        lines[i] = texts[0] if texts else ""
    assert oom_at is not None, "the planted leak never ran out of memory"
    assert oom_at > 10  # the cap leaves room for a loop worth forecasting
    assert not made[1].forecasts and not made[2].forecasts  # too few cells
    for m in (3, 4):
        (f,) = made[m].forecasts
        assert (f.device, f.worker, f.limit_kind) == (0, None, "cap")
        assert f.bytes_per_cell == LEAK  # exact: one 64 MiB block a cell
        # cells_left more cells fit under the cap: the next one runs out of memory
        predicted = m + f.cells_left + 1
        assert within(predicted, oom_at, m), (m, f, oom_at)
        assert f"at this rate, out of memory in about {f.cells_left} cells" in lines[m]
    # every later cell until the OOM agrees too
    for m in range(5, oom_at):
        (f,) = made[m].forecasts
        assert within(m + f.cells_left + 1, oom_at, m), (m, f, oom_at)


def test_a_flat_loop_on_the_gpu_gets_no_forecast(gip):
    from jupyter_gpumem._ipython import current

    gip.run_cell("keep = [torch.empty(256 << 20, dtype=torch.uint8, device='cuda')]")
    run(gip, "%gpumem auto on")
    for _ in range(8):
        # allocates and frees: allocated after each cell stays where it was
        _, texts, _ = run(gip, "y = torch.empty(64 << 20, dtype=torch.uint8, device='cuda'); del y")
        assert current().last_report.forecasts == ()
        assert all("at this rate" not in t for t in texts)


SHELL = textwrap.dedent(
    """
    import json
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    from jupyter_gpumem._ipython import current
    STEP = STEP_BYTES
    ip.run_line_magic("gpumem", "auto on")
    r = ip.run_cell('''
    import os, time, multiprocessing as mp
    import torch
    from jupyter_gpumem.collectors import workers as _workers
    def _leaker(conn):
        os.environ["RANK"] = "1"
        held = []
        while True:
            step = conn.recv()
            if step is None:
                break
            try:
                held.append(torch.empty(step, dtype=torch.uint8, device="cuda:0"))
                torch.cuda.synchronize()
                conn.send("ok")
            except torch.OutOfMemoryError:
                conn.send("oom")
    _parent, _child = mp.Pipe()
    _w = mp.get_context("fork").Process(target=_leaker, args=(_child,), daemon=True)
    _w.start()
    ''')
    assert r.success, r.error_in_exec
    out = {"steps": [], "oom_at": None}
    for k in range(1, 200):
        code = (
            f"_parent.send({STEP}); _answer = _parent.recv()\\n"
            "_t = time.monotonic()\\n"
            f"while _answer == 'ok' and time.monotonic() - _t < 30 and not any(\\n"
            f"    d.allocated >= {STEP} * {k} for w in _workers.live() if w.pid == _w.pid\\n"
            "    for d in w.devices):\\n"
            "    time.sleep(0.02)\\n"
        )
        with capture_output() as cap:
            r = ip.run_cell(code)
        assert r.success, r.error_in_exec
        if ip.user_ns["_answer"] == "oom":
            out["oom_at"] = k
            break
        rep = current().last_report
        out["steps"].append({
            "forecasts": [
                [f.worker, f.device, f.bytes_per_cell, f.cells_left, f.limit_kind]
                for f in rep.forecasts
            ],
            "line": "".join(o.data.get("text/plain", "") for o in cap.outputs),
        })
    ip.user_ns["_parent"].send(None)
    ip.user_ns["_w"].join(30)
    out["cuda_in_kernel"] = ip.user_ns["torch"].cuda.is_initialized()
    print(json.dumps(out))
    """
)


def test_a_worker_that_leaks_per_step_is_forecast_within_ten_percent():
    total = torch.cuda.mem_get_info(0)[1]
    step = max(GiB, (total // 24) // (2 * MiB) * (2 * MiB))  # about 24 steps fill the GPU
    out = subprocess.run(
        [sys.executable, "-c", SHELL.replace("STEP_BYTES", str(step))],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["cuda_in_kernel"] is False  # the kernel never started CUDA
    oom_at = got["oom_at"]
    assert oom_at is not None and oom_at > 10, got
    steps = got["steps"]
    assert not steps[0]["forecasts"] and not steps[1]["forecasts"]
    for m in (3, 4):
        ((worker, device, per_cell, left, kind),) = steps[m - 1]["forecasts"]
        assert worker.startswith("rank 1 (pid ") and device == 0 and kind == "device"
        assert per_cell == step
        assert within(m + left + 1, oom_at, m), (m, left, oom_at)
        assert (
            f"{worker} cuda:0: at this rate, out of memory in about {left} cells"
            in (steps[m - 1]["line"])
        )
