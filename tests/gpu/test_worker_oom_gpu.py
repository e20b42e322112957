"""A rank's OOM post-mortem on two GPUs: a DDP job of 2 ranks (``torch.multiprocessing``
spawn, NCCL) launched from a measured cell, where rank 1 runs out of memory under a cap.
Rank 1's own OOM observer hands its allocator snapshot to the kernel; the cell's report
shows rank 1's post-mortem, whose largest free block must equal what rank 1's own
``torch.cuda.memory._snapshot()`` said at the failure (rank 1 writes that to a file).

Runs in a fresh interpreter (an IPython shell with the extension), as tests/gpu/
test_workers.py does. Written 2026-11-26; not run yet on GPUs.
"""

from __future__ import annotations

import json
import os
import socket
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
MiB = 1 << 20

RANK = textwrap.dedent(
    """
    import json, os, time
    import torch
    import torch.distributed as dist
    import jupyter_gpumem

    GiB, MiB = 1 << 30, 1 << 20

    def largest_free(snap, device):
        best = 0
        for s in snap["segments"]:
            if s["device"] != device:
                continue
            run = 0
            for b in s["blocks"]:
                run = run + b["size"] if b["state"] == "inactive" else 0
                best = max(best, run)
        return best

    def train(r, out):
        jupyter_gpumem.report_worker()
        torch.cuda.set_device(r)
        dist.init_process_group("nccl", rank=r, world_size=2)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Linear(1024, 1024).cuda(r), device_ids=[r]
        )
        model(torch.ones(8, 1024, device=r)).sum().backward()
        if r == 1:
            torch.cuda.set_per_process_memory_fraction(
                6 * GiB / torch.cuda.mem_get_info(r)[1], r
            )
            # 20 blocks of 100 MiB in one 2 GiB segment, every other one freed: pieces
            held = torch.empty(2000 * MiB, dtype=torch.uint8, device=r)
            del held
            parts = [torch.empty(100 * MiB, dtype=torch.uint8, device=r) for _ in range(20)]
            del parts[::2]
            time.sleep(1.0)  # the reporter's first reading attaches its OOM observer
            seen = {}
            def observer(device, alloc, allowed, free):
                snap = torch.cuda.memory._snapshot()
                seen.update(largest=largest_free(snap, device), requested=alloc)
            torch._C._cuda_attach_out_of_memory_observer(observer)
            try:
                torch.empty(8 * GiB, dtype=torch.uint8, device=r)
            except torch.cuda.OutOfMemoryError:
                pass
            with open(out, "w") as f:
                json.dump(seen, f)
        dist.barrier()
        dist.destroy_process_group()
    """
)

SHELL = textwrap.dedent(
    """
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    CELL = '''%%gpumem -o rep
    import os, sys
    import torch.multiprocessing as tmp
    sys.path.insert(0, @DIR@)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", @PORT@
    import oom_rank
    tmp.spawn(oom_rank.train, args=(@OUT@,), nprocs=2)
    '''
    d, port, out = sys.argv[1:4]
    cell = CELL.replace("@DIR@", repr(d)).replace("@PORT@", repr(port)).replace("@OUT@", repr(out))
    r = ip.run_cell(cell)
    assert r.success, r.error_in_exec
    rep = ip.user_ns["rep"]
    from jupyter_gpumem.reporters.text import cell_report_text
    pms = {w.rank: w.postmortem for w in rep.workers}
    p = pms.get(1)
    print(json.dumps({
        "ranks": sorted(k for k in pms if k is not None),
        "pm": None if p is None else [p.device, p.requested, p.largest_free_block, p.cap],
        "rank0_pm": pms.get(0) is not None,
        "left": sorted(n for n in __import__("os").listdir(
            __import__("os").path.dirname(__import__("os").environ["JUPYTER_GPUMEM_WORKERS"])
        ) if n != "s"),
        "text": cell_report_text(rep),
    }))
    """
)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_rank_1_oom_post_mortem_matches_its_own_snapshot(tmp_path):
    (tmp_path / "oom_rank.py").write_text(RANK)
    out = tmp_path / "seen.json"
    proc = subprocess.run(
        [sys.executable, "-c", SHELL, str(tmp_path), _free_port(), str(out)],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    seen = json.loads(out.read_text())
    assert got["ranks"] == [0, 1]
    assert got["pm"] is not None and not got["rank0_pm"], got["text"]
    device, requested, largest, cap = got["pm"]
    assert (device, requested) == (1, seen["requested"])
    assert largest == seen["largest"] > 0  # rank 1's own snapshot at the failure
    assert cap is not None and cap <= 6 * GiB
    assert got["left"] == []  # the snapshot file was read once and deleted
    assert "out of memory on rank 1 (pid" in got["text"]
