"""examples/quickstart.ipynb runs top to bottom in a real kernel on a GPU, and says what
it promises."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.kernel,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
NB = Path(__file__).parents[2] / "examples" / "quickstart.ipynb"


def test_quickstart_runs():
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NB, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", out
            texts.append(out.get("text", "") + out.get("data", {}).get("text/plain", ""))
    joined = "\n".join(texts)
    assert "gpumem: released to the driver: cuda:0" in joined
    assert "caching allocator is now off" in joined
    assert "OOM as expected" in joined
    assert "FAILED" not in joined
    # the peak cell: the (4096x4096 float32) temporaries peaked above what the cell kept
    peak_line = next(t for t in texts if t.startswith("("))
    above, kept = (int(x) for x in peak_line.strip("()").split(","))
    a = 4096 * 4096 * 4
    # a, the 4-byte sum b (rounded to 512 B), and on the first matmul the cuBLAS workspace,
    # which torch takes from its own caching allocator and keeps (32 MiB seen on an H200).
    workspace = kept - (a + 512)
    assert workspace == 0 or (workspace % (1 << 20) == 0 and workspace <= 64 << 20), kept
    # the peak: a, the workspace, a @ a and its relu alive at once; the sum came after
    assert above == 3 * a + workspace


WHO = Path(__file__).parents[2] / "examples" / "who_holds_it.ipynb"


def test_who_holds_it_names_the_leak_and_the_fix():
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(WHO, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    code = [c for c in nb.cells if c.cell_type == "code"]

    def text(cell):
        return "\n".join(
            o.get("text", "") + o.get("data", {}).get("text/plain", "")
            for o in cell.get("outputs", [])
        )

    def count(cell):
        return cell["execution_count"]

    steps = [c for c in code if c.source.startswith("loss = model(xb)")]
    assert len(steps) == 3
    # each step keeps the ReLU output (64 MiB) and the output squared (16 KiB): 64.02 MiB
    for c in steps:  # auto mode: each step kept one step of graph, allocated at line 1
        line = text(c)
        assert "alloc +64.02 MiB" in line, line
        assert "top line 1 `loss = model(xb).square().mean()` 64.02 MiB" in line, line
    who = text(next(c for c in code if c.source.endswith("%gpumem who")))
    total_row = next(r for r in who.splitlines() if r.startswith("total "))
    assert "192.05 MiB" in total_row and "autograd graph" in total_row, who
    by_line = text(next(c for c in code if "--by line" in c.source))
    assert f"In[{count(steps[-1])}] line 1" in by_line  # same code: the latest run's count
    assert "held by total" in by_line
    after = text(next(c for c in code if c.source.startswith("total = total.detach()")))
    assert not any(r.startswith("total ") and "autograd" in r for r in after.splitlines())
    oom = text(next(c for c in code if c.source.startswith("%%gpumem\nbig = ")))
    assert "FAILED (OutOfMemoryError" in oom
    # judged against what the cell needs (nothing above its start; the request): it covers
    # that need so far, "maybe", since nothing says the cell needs no more after the failure
    assert "`del acts` frees 1.25 GiB: covers the" in oom and "maybe" in oom
    assert "out of memory on cuda:0: fixes, best first" in oom
    failed = text(next(c for c in code if c.source == "%%gpumem\nforward()"))
    assert "the kept traceback holds 512.00 MiB" in failed
    released = text(next(c for c in code if c.source == "%gpumem release-traceback"))
    assert "freed cuda:0 512.00 MiB" in released


DEMO = Path(__file__).parents[2] / "examples" / "demo.ipynb"


def test_the_demo_shows_each_feature_on_a_gpu():
    """examples/demo.ipynb (what `jupyter-gpumem demo` opens) runs on a GPU, and each of its
    sections shows what its text promises, with the exact figures of its allocations."""
    import re

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(DEMO, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    code = [c for c in nb.cells if c.cell_type == "code"]

    def text(i):
        return "\n".join(
            o.get("text", "") + o.get("data", {}).get("text/plain", "")
            for o in code[i].get("outputs", [])
        )

    errors = [(i, o["ename"]) for i, c in enumerate(code) for o in c.outputs if "ename" in o]
    assert errors == [(9, "OutOfMemoryError")], errors  # only the cell tagged to raise
    report = text(1)  # 256 MiB kept, a 768 MiB temporary freed
    assert "allocated              256.00 MiB (+256.00 MiB)" in report
    assert "peak allocated         1.00 GiB (+1.00 GiB above start)" in report
    assert "replay" not in report
    assert "outside PyTorch" in text(2)
    who = text(5)  # the graphs `total` keeps are named, with the line that made them
    assert re.search(r"^total\s.*autograd graph", who, re.MULTILINE), who
    assert "In[" in text(6) and "line" in text(6)
    oom = text(9)
    assert "out of memory on cuda:0" in oom and "fixes, best first" in oom
    # the segment map after freeing every other block: free pieces beside live blocks
    assert re.search(r"free pieces in segments with live blocks: [1-9]", text(11)), text(11)
    assert "cell" in text(12).splitlines()[0]  # the history's table
    scan = text(15)
    assert re.search(r"largest batch that fits in .*: \d+ \(verified", scan), scan
