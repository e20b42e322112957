"""`jupyter-gpumem run` on a real GPU: --fits caps PyTorch's memory, a notebook that needs
3 GiB does not fit in 2 GiB (exit 1, the cell named) and fits in 4 GiB (exit 0), and the
budgets see the exact allocator figures.

Skipped without CUDA. Run on the GPU machine: ``pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.kernel,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
GiB = 1 << 30
EXAMPLE = Path(__file__).parents[2] / "examples" / "ci" / "train_budget.ipynb"


def notebook(path: Path) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [
        nbformat.v4.new_code_cell("import torch"),
        nbformat.v4.new_code_cell("x = torch.empty(3 << 30, dtype=torch.uint8, device='cuda')"),
        nbformat.v4.new_code_cell("del x"),
    ]
    nbformat.write(nb, str(path))
    return path


def run(*args: str | Path):
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_GPUMEM_REPLAY"}
    p = subprocess.run(
        [sys.executable, "-m", "jupyter_gpumem", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_does_not_fit_in_2gib(tmp_path):
    js = tmp_path / "small.json"
    p = run("run", notebook(tmp_path / "nb.ipynb"), "--fits", "2GiB", "--json", js)
    assert p.returncode == 1, p.stderr
    assert "cell 2 [2] `x = torch.empty(3 << 30, dtype=torch.uint8, device='cuda')` ran out" in (
        p.stderr
    )
    assert "under --fits 2.00 GiB: the notebook does not fit" in p.stderr
    doc = json.loads(js.read_text())
    assert doc["limit"]["bytes"] == pytest.approx(2 * GiB, abs=1)
    oom = doc["cells"][1]
    assert oom["status"] == "error" and oom["out_of_memory"]
    assert oom["postmortem_fix"], "the kernel's post-mortem names a fix"
    assert doc["cells"][2]["status"] == "not_run"


def test_fits_in_4gib_with_exact_figures(tmp_path):
    js = tmp_path / "big.json"
    p = run(
        "run",
        notebook(tmp_path / "nb.ipynb"),
        "--fits",
        "4GiB",
        "--json",
        js,
        "--budget",
        "peak<=3GiB",
        "--budget",
        "kept<=3GiB",
    )
    assert p.returncode == 0, p.stderr
    assert "fits in 4.00 GiB" in p.stderr
    doc = json.loads(js.read_text())
    alloc = doc["cells"][1]["devices"][0]
    assert alloc["kept"] == 3 * GiB and alloc["peak"] == 3 * GiB  # exact, to the byte
    freed = doc["cells"][2]["devices"][0]
    assert freed["kept"] == -3 * GiB
    assert doc["summary"]["budgets"]["failed"] == 0
    # the same notebook against a budget one byte too small
    p = run("run", notebook(tmp_path / "nb2.ipynb"), "--budget", f"peak<{3 * GiB}", "-q")
    assert p.returncode == 1, p.stderr
    assert f"peak 3.00 GiB ({3 * GiB} B) >= 3.00 GiB ({3 * GiB} B) on cuda:0" in p.stderr


def test_the_example_notebook_holds_its_budgets(tmp_path):
    js = tmp_path / "example.json"
    p = run(
        "run",
        EXAMPLE,
        "--budget",
        "peak<=2GiB",
        "--budget",
        "kept<=512MiB",
        "--fits",
        "3GiB",
        "--json",
        js,
        "--html",
        tmp_path / "example.html",
    )
    assert p.returncode == 0, p.stderr + p.stdout
    doc = json.loads(js.read_text())
    assert doc["summary"]["budgets"]["failed"] == 0
    assert doc["summary"]["budgets"]["held"] >= 8
