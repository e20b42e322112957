"""A rank's segment map on two GPUs: ``%gpumem segments --rank 1`` asks rank 1 of a fork
launch (``torch.multiprocessing.start_processes(..., start_method="fork")``, what
accelerate's ``notebook_launcher`` does) for its own allocator snapshot. Rank 1 allocates
tensors of exact sizes on cuda:1, frees some, writes the segments of its own
``torch.cuda.memory._snapshot()`` (address, total_size) to a file and waits; the map the
kernel shows must have the same segments, addresses and sizes, and CUDA must never start
in the kernel.

Runs in a fresh interpreter (an IPython shell with the extension), as tests/gpu/
test_workers.py does: the test process itself has CUDA up (other GPU tests), and a forked
child of such a process cannot use CUDA.
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
MiB = 1 << 20

SHELL = textwrap.dedent(
    """
    import json, os, sys, time
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    DIR = sys.argv[1]
    CELL = '''%%gpumem -q
    import os, json, time, torch
    import torch.multiprocessing as tmp
    DIR = @DIR@
    HELD = []
    def rank(r):
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(r), "2"
        torch.cuda.set_device(r)
        MiB = 1 << 20
        # large-pool segments of exact sizes, one with a freed piece; small-pool blocks
        for n in (256 * MiB, 100 * MiB, 40 * MiB, 3 * MiB, 512 << 10, 4096):
            HELD.append(torch.empty(n, dtype=torch.uint8, device=r))
        gone = torch.empty(64 * MiB, dtype=torch.uint8, device=r)
        HELD.append(torch.empty(30 * MiB, dtype=torch.uint8, device=r))
        del gone
        torch.cuda.synchronize(r)
        if r == 1:
            snap = torch.cuda.memory._snapshot()
            segs = sorted(
                [s["address"], s["total_size"]] for s in snap["segments"] if s["device"] == 1
            )
            with open(os.path.join(DIR, "truth.json"), "w") as f:
                json.dump(segs, f)
        release = os.path.join(DIR, "release")
        deadline = time.monotonic() + 30
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
    ctx = tmp.start_processes(rank, nprocs=2, join=False, start_method="fork")
    '''
    r = ip.run_cell(CELL.replace("@DIR@", repr(DIR)))
    assert r.success, r.error_in_exec
    truth_path = os.path.join(DIR, "truth.json")
    deadline = time.monotonic() + 60
    while not os.path.exists(truth_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the rank's first report (its reporter ticks every 0.25 s)
    from jupyter_gpumem._ipython import current
    from jupyter_gpumem.protocol.handler import Handler
    from jupyter_gpumem.protocol.stream import SampleStream
    try:
        t = time.monotonic()
        with capture_output() as cap:
            ip.run_line_magic("gpumem", "segments --rank 1")
        took = time.monotonic() - t
        session = current()
        stream = SampleStream(session.collector, None)
        reply = Handler(session, stream).handle(
            {"protocol": 1, "action": "segments", "args": {"rank": 1, "max_segments": 5000}}
        )
        with capture_output() as cap0:
            ip.run_line_magic("gpumem", "segments --rank 0")
    finally:
        open(os.path.join(DIR, "release"), "w").close()
    ctx = ip.user_ns["ctx"]
    while not ctx.join(60):
        pass
    texts = [o.data.get("text/plain", "") for o in cap.outputs]
    print(json.dumps({
        "cuda_in_kernel": ip.user_ns["torch"].cuda.is_initialized(),
        "took": took,
        "stdout": cap.stdout,
        "texts": texts,
        "rank0": [o.data.get("text/plain", "") for o in cap0.outputs],
        "reply": reply,
    }))
    """
)


def test_rank_1_segment_map_equals_its_own_snapshot(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SHELL, str(tmp_path)],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    truth = [tuple(s) for s in json.loads((tmp_path / "truth.json").read_text())]
    assert truth, "rank 1 holds segments"
    assert got["cuda_in_kernel"] is False  # asking never starts CUDA in the kernel
    assert got["took"] < 2.5, got["took"]
    assert got["stdout"] == "", got["stdout"]  # no refusal, no note
    (text,) = got["texts"]
    assert text.startswith("rank 1 (pid "), text
    assert f") cuda:1: {len(truth)} segment(s) hold " in text.splitlines()[0], text
    reply = got["reply"]
    assert reply["status"] == "ok", reply
    result = reply["result"]
    assert result["worker"]["rank"] == 1 and result["worker"]["trimmed"] is False
    (m,) = result["devices"]
    assert m["device"] == 1
    shown = sorted((s["address"], s["size"]) for s in m["segments"])
    assert shown == sorted(truth)  # same count, addresses and sizes as rank 1's own
    assert m["summary"]["reserved"] == sum(size for _, size in truth)
    for address, _ in truth:
        assert f"@{address:#x}:" in text or len(truth) > 30  # the text lists 30 at most
    (text0,) = got["rank0"]
    assert text0.startswith("rank 0 (pid ") and ") cuda:0: " in text0
