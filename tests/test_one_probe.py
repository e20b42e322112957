"""One probe and one wording for "there is no GPU for this" (issue 31).

``collectors/torch_build.py`` is the one place that asks which torch is imported and
whether CUDA is up; :func:`why_no_gpu` is the one place that words a refusal for want of
torch or a GPU. The scan below keeps the first true; the calls of the front ends keep the
second.
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

import jupyter_gpumem
from jupyter_gpumem.collectors import torch_build
from jupyter_gpumem.collectors.torch_build import why_no_gpu

PACKAGE = Path(jupyter_gpumem.__file__).parent
# The model layer may not import the collectors (tests/test_architecture.py): its replay
# sentence reads the kernel's torch version itself.
EXEMPT = {"collectors/torch_build.py"}


def _sys_modules(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _torch(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "torch"


def probes(tree: ast.AST) -> list[int]:
    """Lines that ask sys.modules for torch, or ask CUDA whether it is initialised."""
    lines = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            # sys.modules.get("torch")
            if f.attr == "get" and _sys_modules(f.value) and node.args and _torch(node.args[0]):
                hit = True
            # <anything>.cuda.is_initialized()
            if (
                f.attr == "is_initialized"
                and isinstance(f.value, ast.Attribute)
                and f.value.attr == "cuda"
            ):
                hit = True
        # sys.modules["torch"]
        if isinstance(node, ast.Subscript) and _sys_modules(node.value) and _torch(node.slice):
            hit = True
        # "torch" in sys.modules
        if (
            isinstance(node, ast.Compare)
            and _torch(node.left)
            and any(_sys_modules(c) for c in node.comparators)
        ):
            hit = True
        if hit:
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_each_way_of_asking():
    src = (
        'import sys\nt = sys.modules.get("torch")\nu = sys.modules["torch"]\n'
        'v = "torch" in sys.modules\nw = t.cuda.is_initialized()\nx = "torch.cuda"\n'
    )
    assert probes(ast.parse(src)) == [2, 3, 4, 5]


def test_only_torch_build_asks_which_torch_is_imported():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in EXEMPT or rel.startswith("testing/"):
            continue
        found += [f"{rel}:{n}" for n in probes(ast.parse(path.read_text(), rel))]
    assert found == [], "ask collectors/torch_build.py (imported_torch, cuda_ready)"


# -- the one wording --------------------------------------------------------------------
def _fake_torch(cuda: str | None, initialized: bool, available: bool = True):
    return types.SimpleNamespace(
        __version__="9.9.9",
        version=types.SimpleNamespace(cuda=cuda, hip=None),
        cuda=types.SimpleNamespace(
            is_initialized=lambda: initialized, is_available=lambda: available
        ),
    )


def test_the_wording_for_each_reason(monkeypatch):
    monkeypatch.setattr(torch_build, "torch_installed", lambda: True)
    cpu = _fake_torch(None, False)
    idle = _fake_torch("13.0", False, available=False)
    up = _fake_torch("13.0", True)
    needs = "--x needs torch and a CUDA GPU: "
    assert why_no_gpu("--x", None) == needs + "torch is not imported in this kernel"
    assert why_no_gpu("f()", None, where="process") == (
        "f() needs torch and a CUDA GPU: torch is not imported in this process"
    )
    assert why_no_gpu("--x", None, before_cell="it hooks in first") == needs + (
        "torch was not imported when the cell began: import torch before the cell, as it "
        "hooks in first (the tool never imports it itself)"
    )
    assert why_no_gpu("--x", cpu) == needs + "torch 9.9.9 is a CPU-only build"
    assert why_no_gpu(None, cpu) == "torch 9.9.9 is a CPU-only build"
    # what each feature needs: a GPU build, a GPU torch sees, or CUDA up
    assert why_no_gpu("--x", idle) is None
    assert why_no_gpu("--x", idle, needs="gpu") == needs + "torch 9.9.9 finds no GPU"
    assert why_no_gpu("--x", idle, needs="memory") == needs + (
        "CUDA is not initialised in this kernel yet"
    )
    assert why_no_gpu("--x", up, needs="memory") is None
    assert why_no_gpu("--x", up, needs="gpu") is None
    # a reading's state says the same
    assert why_no_gpu("--x", state="cpu_only", version="9.9.9") == why_no_gpu("--x", cpu)
    assert why_no_gpu("--x", state="no_torch") == why_no_gpu("--x", None)
    assert why_no_gpu("--x", state="ok") is None


def test_not_installed_is_told_apart_where_a_cell_option_needs_torch(monkeypatch):
    monkeypatch.setattr(torch_build, "torch_installed", lambda: False)
    said = why_no_gpu("--x", None, before_cell="it hooks in first")
    assert said is not None
    assert said.startswith(
        "--x needs torch and a CUDA GPU: torch is not installed in this kernel; "
    )
    assert torch_build.install_hint() in said


# -- every front end says it through why_no_gpu -------------------------------------------
@pytest.fixture
def spy(monkeypatch):
    """why_no_gpu, recording what it said (front ends that import it when they refuse)."""
    said: list[str | None] = []
    real = torch_build.why_no_gpu

    def recording(*args, **kwargs):
        said.append(real(*args, **kwargs))
        return said[-1]

    monkeypatch.setattr(torch_build, "why_no_gpu", recording)
    return said


def test_cell_options_without_torch_refuse_through_why_no_gpu(monkeypatch, spy):
    from jupyter_gpumem._ipython import dry_run_cell, scan_cell
    from jupyter_gpumem._ipython.parsers import CellOptions

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    dry = dry_run_cell.why_not(CellOptions())
    assert dry is not None and dry.startswith("--dry-run needs torch and a CUDA GPU: ")
    assert spy == [dry]
    scan = scan_cell._no_gpu_for_scan()
    assert scan is not None and scan.startswith("--scan needs torch and a CUDA GPU: ")
    assert spy == [dry, scan]


def test_api_and_services_refuse_through_why_no_gpu(monkeypatch, spy):
    from jupyter_gpumem.collectors.allocator import TorchBackend
    from jupyter_gpumem.core.attribution import why_nothing
    from jupyter_gpumem.errors import NoGpuError

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with pytest.raises(NoGpuError) as e:
        jupyter_gpumem.dry_run(lambda: None)
    assert spy == [str(e.value)]
    assert str(e.value) == why_no_gpu("dry_run()", None)
    reason = why_no_gpu(None, None)
    assert reason == "torch is not imported in this kernel"
    assert why_nothing(None) == f"{reason}: PyTorch holds no GPU memory"
    backend = TorchBackend()
    assert backend.actionable() == f"{reason}: nothing to act on"
    assert backend.caching_supported() == reason


def test_a_cuda_device_is_named_in_one_place():
    """``cuda:N`` is written by ``units.cuda_label`` (and ``device_label`` for a reading);
    no f-string spells it again."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parent.parent / "jupyter_gpumem"
    spelled = re.compile(r"""f["'][^"']*cuda:\{""")
    found = [
        f"{p.relative_to(package)}:{i}"
        for p in package.rglob("*.py")
        if p.name != "units.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert found == []
