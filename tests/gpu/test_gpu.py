"""GPU tests: real allocations on a real CUDA device, numbers checked against ground truth.

Skipped without CUDA. Run on the GPU machine: ``pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

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


@pytest.fixture
def gip(ip):
    ip.run_cell("import torch")
    ip.run_cell("torch.empty(0, device='cuda:0')")  # context exists before the measured cells
    ip.run_cell("torch.cuda.empty_cache()")
    yield ip
    ip.run_cell("%gpumem limit off")
    ip.run_cell("%gpumem caching on")
    for name in ("x", "y", "z", "rep", "u"):
        ip.user_ns.pop(name, None)
    import gc

    gc.collect()
    torch.cuda.empty_cache()


def test_keep_exactly_n_bytes(gip):
    n = 256 * MiB
    res, texts, _ = run(
        gip, f"%%gpumem -o rep\nx = torch.empty({n}, dtype=torch.uint8, device='cuda')"
    )
    assert res.success
    d = gip.user_ns["rep"].device(0)
    assert d.allocated_delta == n
    assert d.peak_above_start == n
    assert d.peak_exact
    assert d.device_allocs == 1  # one cudaMalloc of exactly that segment
    assert d.reserved_delta == n
    assert "+256.00 MiB" in texts[0]


def test_transient_spike_exact_peak(gip):
    code = (
        "%%gpumem -o rep\n"
        "y = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\n"
        "z = torch.empty(768 << 20, dtype=torch.uint8, device='cuda')\n"
        "del z\n"
    )
    _res, _texts, _ = run(gip, code)
    d = gip.user_ns["rep"].device(0)
    assert d.allocated_delta == 64 * MiB
    assert d.peak_above_start == (64 + 768) * MiB
    assert d.peak_allocated - d.before.allocator.allocated == (64 + 768) * MiB
    # the freed 768 MiB stays cached: reserved grew, allocated did not
    assert d.reserved_delta >= 768 * MiB
    assert any("Temporaries peaked" in h for h in gip.user_ns["rep"].hints)


def test_keep_peak_leaves_global_counter(gip):
    gip.run_cell("_big = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del _big")
    before_peak = torch.cuda.max_memory_allocated(0)
    run(gip, "%%gpumem --keep-peak -o rep\nu = torch.empty(1 << 20, device='cuda')")
    rep = gip.user_ns["rep"].device(0)
    assert torch.cuda.max_memory_allocated(0) == before_peak  # untouched
    assert not rep.peak_exact  # no new global peak: only an upper bound
    run(gip, "%%gpumem -o rep\nu = None")
    assert torch.cuda.max_memory_allocated(0) < before_peak  # default resets it


def test_empty_cache_reports_released_bytes(gip):
    gip.run_cell("x = torch.empty(512 << 20, dtype=torch.uint8, device='cuda'); del x")
    reserved = torch.cuda.memory_reserved(0)
    allocated = torch.cuda.memory_allocated(0)
    res, _, cap = run(gip, "%gpumem empty-cache")
    assert res.success
    released = reserved - torch.cuda.memory_reserved(0)
    assert released >= 512 * MiB
    # Everything releasable went back: what stays cached is free pieces of segments that
    # still hold live blocks (earlier tests' process-wide cuBLAS workspaces, say).
    segments = [s for s in torch.cuda.memory_snapshot() if s["device"] == 0]
    assert all(s["allocated_size"] > 0 for s in segments)
    pieces = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive")
    assert torch.cuda.memory_reserved(0) - allocated == pieces
    from jupyter_gpumem.units import format_bytes

    assert format_bytes(released) in cap.stdout


def test_caching_off_device_level_shows_what_counters_miss(gip):
    res, _, cap = run(gip, "%gpumem caching off")
    assert res.success and "caching allocator is now off" in cap.stdout
    n = 256 * MiB
    run(gip, f"%%gpumem -o rep\nx = torch.empty({n}, dtype=torch.uint8, device='cuda')")
    rep = gip.user_ns["rep"]
    d = rep.device(0)
    assert d.allocated_delta == 0  # invisible to PyTorch's counters
    assert n <= d.outside_torch_delta <= n + 4 * MiB  # the device sees it
    assert rep.after.caching is False
    assert any("Caching is off" in h for h in rep.hints)
    gip.user_ns.pop("x")
    run(gip, "%gpumem caching on")
    from jupyter_gpumem._ipython import current

    assert current().collector.measure().caching is True
    # allocations are cached again: a freed block stays reserved
    gip.run_cell("x = torch.empty(64 << 20, dtype=torch.uint8, device='cuda'); del x")
    assert torch.cuda.memory_reserved(0) - torch.cuda.memory_allocated(0) >= 64 * MiB


def test_limit_oom_at_cap_report_still_shown(gip):
    res, _, cap = run(gip, "%gpumem limit 1GiB")
    assert res.success and "1.00 GiB" in cap.stdout
    res, texts, _ = run(
        gip, "%%gpumem -o rep\nx = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')"
    )
    assert not res.success
    assert isinstance(res.error_in_exec, torch.OutOfMemoryError)
    rep = gip.user_ns["rep"]
    assert rep.failed and rep.error.startswith("OutOfMemoryError")
    d = rep.device(0)
    assert d.ooms == 1
    assert [o.requested for o in rep.ooms] == [2 << 30]
    assert "FAILED (OutOfMemoryError" in texts[0]
    run(gip, "%gpumem limit off")
    assert torch._C._cuda_getMemoryFraction(0) == 1.0


def test_limit_too_large_is_usage_error(gip):
    res, _, _ = run(gip, "%gpumem limit 100TiB")
    assert not res.success and "more than device 0 has" in str(res.error_in_exec)


def test_now_table_matches_torch(gip):
    gip.run_cell("x = torch.empty(100 << 20, dtype=torch.uint8, device='cuda')")
    from jupyter_gpumem._ipython import current

    m = current().collector.measure()
    d = m.device(0)
    assert d.allocator.allocated == torch.cuda.memory_allocated(0)
    assert d.allocator.reserved == torch.cuda.memory_reserved(0)
    _free, total = torch.cuda.mem_get_info(0)
    assert d.process_used is None or d.process_used >= d.allocator.reserved
    assert d.total >= total


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_measuring_creates_no_context_on_other_devices(gip):
    """Readings touch only devices this process already uses: cuda:1 stays context-free
    (NVML figures only) through %gpumem, auto mode and measured cells on cuda:0."""
    assert not torch._C._cuda_hasPrimaryContext(1)
    run(gip, "%gpumem auto on")
    run(gip, "%%gpumem -o rep\nx = torch.empty(1 << 20, device='cuda:0')")
    _, texts, _ = run(gip, "%gpumem")
    run(gip, "%gpumem reset-peak")
    run(gip, "%gpumem auto off")
    assert not torch._C._cuda_hasPrimaryContext(1)
    from jupyter_gpumem._ipython import current

    d1 = current().collector.measure().device(1)
    assert d1 is not None and not d1.initialized and d1.allocator is None
    assert d1.device_used is not None  # NVML still reports it
    assert "cuda:1" in texts[0]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_devices(gip):
    code = (
        "%%gpumem -o rep\n"
        "x = torch.empty(64 << 20, dtype=torch.uint8, device='cuda:0')\n"
        "y = torch.empty(128 << 20, dtype=torch.uint8, device='cuda:1')\n"
    )
    run(gip, code)
    rep = gip.user_ns["rep"]
    assert rep.device(0).allocated_delta == 64 * MiB
    assert rep.device(1).allocated_delta == 128 * MiB
    run(gip, "%%gpumem -d 1 -o rep\nz = torch.empty(1 << 20, device='cuda:0')")
    assert [d.index for d in gip.user_ns["rep"].devices] == [1]


def _run_python(script: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=os.environ, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_never_creates_a_context(tmp_path):
    """Loading, %gpumem, auto mode and measured cells after `import torch`: no context."""
    script = textwrap.dedent(
        """
        import json, torch
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "gpumem")
        ip.run_cell("%gpumem")
        ip.run_cell("%gpumem auto on")
        ip.run_cell("import torch; a = 1")
        ip.run_cell("%%gpumem\\nb = 2")
        ip.run_cell("%gpumem history")
        n = torch.cuda.device_count()
        print(json.dumps({"init": torch.cuda.is_initialized(),
                          "ctx": [torch._C._cuda_hasPrimaryContext(i) for i in range(n)]}))
        """
    )
    out = _run_python(script)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"init": False, "ctx": [False] * len(result["ctx"])}


def test_context_created_inside_cell_counts_outside_torch(tmp_path):
    script = textwrap.dedent(
        """
        import json, torch
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "gpumem")
        ip.run_cell("import torch")
        ip.run_cell("%%gpumem -q -o rep\\nx = torch.empty(1 << 20, device='cuda')")
        d = ip.user_ns["rep"].device(0)
        print(json.dumps({"alloc": d.allocated_delta, "outside": d.outside_torch_delta,
                          "init": [d.before.initialized, d.after.initialized]}))
        """
    )
    out = _run_python(script)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["alloc"] == 4 * MiB  # 1M floats
    assert r["init"] == [False, True]
    assert r["outside"] > 100 * MiB  # the CUDA context itself


def test_nvml_process_list_is_pynvmls(gip):
    """The process list read in one driver call into a kept array (collectors/nvml.py)
    equals pynvml's public call, entry for entry, and this process's figure is in it."""
    pynvml = pytest.importorskip("pynvml")
    from jupyter_gpumem.collectors.nvml import Nvml, _ComputeProcesses

    nv = Nvml()
    idx = nv.nvml_index(0)
    assert idx is not None and isinstance(nv._processes, _ComputeProcesses)
    x = torch.empty(96 * MiB, dtype=torch.uint8, device="cuda:0")
    h = pynvml.nvmlDeviceGetHandleByIndex(idx)
    for _ in range(3):  # another process may start or stop between the two calls
        public = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        ours = nv.compute_processes(idx)
        if ours == public:
            break
    assert ours == public
    assert nv.process_used(idx) == dict(public)[os.getpid()] >= torch.cuda.memory_reserved(0)
    del x
