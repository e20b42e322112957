"""Comparing runs on a real GPU (issue 33): `jupyter-gpumem run --save --breakdown-all`
records, through a real CUDA kernel, the lines that allocated what each cell kept and
what each cell's peak is made of; a run of an edited notebook against it is a regression
named by the line and the category that grew, to the byte; the same notebook against it
passes; and `%gpumem history --diff` in a live kernel says the same.

Ground truth is the code: ``b`` is 32 MiB, then 48 MiB; the MLP's parameters are their
shapes times 4 bytes (each storage rounded up to 512 B, as the allocator counts it).

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
MiB = 1 << 20


def mlp(hidden: int) -> str:
    return (
        f"net = torch.nn.Sequential(torch.nn.Linear(1024, {hidden}), torch.nn.ReLU(),\n"
        f"                          torch.nn.Linear({hidden}, 1024)).cuda()\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)"
    )


def cells(b_mib: int, hidden: int) -> list[str]:
    return [
        "import torch\ntorch.cuda.init()",
        (
            'a = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")\n'
            f'b = torch.empty({b_mib} << 20, dtype=torch.uint8, device="cuda")'
        ),
        mlp(hidden),
        (
            'inp = torch.randn(512, 1024, device="cuda")\n'
            "net(inp).square().mean().backward()\n"
            "opt.step()\n"
            "opt.zero_grad()"
        ),
    ]


def param_bytes(hidden: int) -> int:
    def r(n: int) -> int:
        return -(-n * 4 // 512) * 512

    return r(1024 * hidden) + r(hidden) + r(hidden * 1024) + r(1024)


def notebook(path: Path, sources: list[str]) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, str(path))
    return path


def gpumem(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_GPUMEM_REPLAY"}
    p = subprocess.run(
        [sys.executable, "-m", "jupyter_gpumem", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    where = tmp_path_factory.mktemp("diff")
    nb = notebook(where / "base.ipynb", cells(32, 4096))
    p = gpumem("run", nb, "--save", where / "base.json", "--breakdown-all", "--repeat", "2", "-q")
    assert p.returncode == 0, p.stderr
    return where, json.loads((where / "base.json").read_text())


def dev0(cell):
    (d,) = [d for d in cell["devices"] if d["index"] == 0]
    return d


def test_save_records_kept_lines_and_breakdowns_measured_in_a_cuda_kernel(saved):
    _, doc = saved
    assert doc["options"]["breakdown_all"] is True and doc["options"]["repeat"] == 2
    tensors = dev0(doc["cells"][1])
    assert tensors["kept"] == 96 * MiB
    # every line that allocated what the cell kept, largest first, to the byte
    assert [(x["line"], x["bytes"]) for x in tensors["kept_lines"]] == [
        (1, 64 * MiB),
        (2, 32 * MiB),
    ]
    assert tensors["kept_lines"][1]["text"].startswith("b = torch.empty(32 << 20")
    step = dev0(doc["cells"][3])
    b = step["breakdown"]
    categories = {c["category"]: c["bytes"] for c in b["categories"]}
    # SGD's momentum is made at the first step: the peak is there, with every gradient
    assert b["phase"] == "optimizer step", b
    assert categories["parameters"] == param_bytes(4096), categories
    assert categories["gradients"] == param_bytes(4096), categories
    assert categories["optimizer state"] == param_bytes(4096), categories
    assert sum(c["bytes"] for c in b["categories"]) == b["peak"] == step["peak"]
    assert any(m["module"].startswith("net.") for m in b["modules"])
    # the peak of reserved memory, and its spread over the two runs
    assert step["peak_reserved"] >= step["peak"]
    assert step["spread"]["runs"] == 2
    low, high = step["spread"]["reserved"]
    assert low <= step["reserved"] <= high


def test_the_same_notebook_passes_against_its_baseline(saved):
    where, _ = saved
    p = gpumem(
        "run",
        where / "base.ipynb",
        "--baseline",
        where / "base.json",
        "--breakdown-all",
        "--json",
        where / "same.json",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "REGRESSION" not in p.stdout
    doc = json.loads((where / "same.json").read_text())
    assert doc["summary"]["baseline"]["exit_code"] == 0
    # exact figures are the same bytes in both runs
    base = json.loads((where / "base.json").read_text())
    for c0, c1 in zip(base["cells"], doc["cells"], strict=True):
        if c0["devices"]:
            assert (dev0(c0)["peak"], dev0(c0)["kept"]) == (dev0(c1)["peak"], dev0(c1)["kept"])


def test_an_edited_notebook_is_a_regression_named_by_line_and_category(saved):
    where, _ = saved
    nb = notebook(where / "edited.ipynb", cells(48, 6144))
    md = where / "edited.md"
    p = gpumem(
        "run",
        nb,
        "--baseline",
        where / "base.json",
        "--breakdown-all",
        "--markdown",
        md,
        "--json",
        where / "edited.json",
    )
    assert p.returncode == 1, p.stdout + p.stderr
    text = p.stdout
    # the tensor cell: kept +16 MiB, the line that keeps it, matched by its edited text
    assert "REGRESSION cell 2 [2] `a = torch.empty(64 << 20" in text
    assert 'line 2 `b = torch.empty(48 << 20, dtype=torch.uint8, device="cuda")`' in text
    assert "+16.00 MiB" in text
    # the step: its parameters grew by the MLP's bytes, to the byte
    base, after = param_bytes(4096), param_bytes(6144)
    from jupyter_gpumem.units import format_bytes

    grew = format_bytes(after - base)
    for category in ("parameters", "gradients", "optimizer state"):
        assert f"category {category} at the peak: +{grew}" in text, text
    assert "FAIL (exit 1)" in p.stderr + text
    assert "REGRESSION" in md.read_text() or "regression" in md.read_text().lower()
    doc = json.loads((where / "edited.json").read_text())
    assert doc["summary"]["baseline"]["exit_code"] == 1


def test_history_diff_in_a_live_kernel(saved):
    """The user edits the notebook and runs the cells in a kernel: `%gpumem history --diff`
    compares what the kernel measured with the saved run."""
    from jupyter_client.manager import start_new_kernel

    where, _ = saved
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_GPUMEM_REPLAY"}
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(where))
    out: list[str] = []

    def hook(msg):
        c = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(c["text"])
        elif msg["msg_type"] in ("execute_result", "display_data"):
            out.append(c["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            out.append("\n".join(c["traceback"]))

    try:
        for code in ["%load_ext jupyter_gpumem", "%gpumem track on", "%gpumem auto on"]:
            kc.execute_interactive(code, timeout=120, output_hook=hook)
        for code in cells(48, 4096):
            kc.execute_interactive(code, timeout=120, output_hook=hook)
        out.clear()
        kc.execute_interactive(
            f"%gpumem history --diff {where / 'base.json'}", timeout=120, output_hook=hook
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    text = "".join(out)
    assert "REGRESSION" in text and "a = torch.empty(64 << 20" in text, text
    assert "+16.00 MiB" in text, text
    # the MLP and the step are the same code as in the saved run: no regression
    regressed = [line for line in text.splitlines() if line.startswith("REGRESSION cell")]
    assert len(regressed) == 1 and "a = torch.empty(64 << 20" in regressed[0], text
