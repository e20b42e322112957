"""Memory in space and time on a real GPU: the segment map of a planted fragmentation, a
traced cell's exact peak and lines, and the memory_viz file."""

from __future__ import annotations

import pickle

import pytest

from tests.gpu.test_attribution import NAMES, cell

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MiB = 1 << 20


@pytest.fixture
def vip(ip):
    cell(
        ip,
        "import torch\ntorch.empty(0, device='cuda:0')\nimport gc; gc.collect()\n"
        "torch.cuda.empty_cache()",
    )
    yield ip
    cell(ip, "%gpumem track off")
    for name in (*NAMES, "kept", "tmp", "many"):
        ip.user_ns.pop(name, None)
    import gc

    gc.collect()
    torch.cuda.empty_cache()


def test_segment_map_of_a_planted_fragmentation(vip):
    cell(vip, "%gpumem track on")
    cell(
        vip,
        "big = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del big\n"
        "blocks = [torch.empty(64 << 20, dtype=torch.uint8, device='cuda')"
        " for _ in range(16)]\n"
        "for i in range(0, 16, 2): blocks[i] = None",
    )
    from jupyter_gpumem._ipython import current

    m = current().who.segment_maps(0)[0]
    seg = next(s for s in m.segments if s.size == 1 << 30)
    assert len(seg.free_pieces) == 8 and {p.size for p in seg.free_pieces} == {64 * MiB}
    assert m.space.largest_free_block == 64 * MiB
    assert all(
        "blocks = [torch.empty(64 << 20" in b.site for b in seg.blocks if b.kind == "allocated"
    )
    _, texts, cap = cell(vip, "%gpumem segments")
    html = next(o.data["text/html"] for o in cap.outputs)
    assert "8 free piece(s) 512.00 MiB (largest 64.00 MiB)" in texts[0]
    assert "largest free block 64.00 MiB" in texts[0]
    # Each planted piece is drawn, titled with its exact size (free pieces share one
    # coloured group since the renderer groups blocks by kind).
    assert html.count("<title>free piece (empty_cache can&#x27;t return it): 64.00 MiB,") == 8


def test_traced_cell_peak_lines_and_memory_viz_file(vip, tmp_path):
    path = tmp_path / "cell.pickle"
    res, texts, _ = cell(
        vip,
        f"%%gpumem --trace --save {path} -o rep\n"
        "kept = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\n"
        "tmp = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')\n"
        "del tmp",
    )
    assert res.success
    rep = vip.user_ns["rep"]
    (t,) = rep.trace.timelines
    assert t.complete
    assert t.peak_above_start == (64 + 256) * MiB == rep.device(0).peak_above_start
    assert t.peak == rep.device(0).peak_allocated
    alive = [(a.size, a.cell_line) for a in t.alive_at_peak()]
    assert alive == [(256 * MiB, 3), (64 * MiB, 2)]
    assert [(a.size, a.cell_line) for a in t.kept()] == [(64 * MiB, 2)]
    assert "alive at the peak" in texts[0] and "line 3 `tmp = torch.empty(256 << 20" in texts[0]
    assert not torch._C._cuda_isHistoryEnabled()  # recording is back off
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    from torch.cuda import _memory_viz

    assert "<html" in _memory_viz.trace_plot(snapshot).lower()
    assert "<html" in _memory_viz.segment_plot(snapshot).lower()
    assert rep.trace.saved == str(path) and rep.trace.saved_bytes == path.stat().st_size
    res, _, _ = cell(vip, f"%%gpumem --save {path}\nx = 1")
    assert "exists" in str(res.error_in_exec)  # never overwrites


def test_trace_returns_to_tracking_and_says_when_entries_ran_out(vip):
    cell(vip, "%gpumem track on")
    _, texts, _ = cell(
        vip,
        "%%gpumem --trace --entries 100 -o rep\n"
        "many = [torch.empty(1024, device='cuda') for _ in range(500)]",
    )
    rep = vip.user_ns["rep"]
    (t,) = rep.trace.timelines
    assert not t.complete and t.entries == 100
    assert "the trace kept only the last 100 entries" in texts[0]
    assert torch._C._cuda_isHistoryEnabled()  # our "state" tracking is on again
    res, _, _ = cell(vip, "x = torch.empty(3 << 20, dtype=torch.uint8, device='cuda')")
    import jupyter_gpumem

    df = jupyter_gpumem.who(by="line")  # sites are still recorded after the trace
    assert (df["key"] == f"In[{res.execution_count}] line 1").any()
