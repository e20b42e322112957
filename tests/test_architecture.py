"""The import graph points down: no module imports a layer above its own, no production
module imports the test-only ``testing`` package, and no production modules import each
other in a circle. The layers, and the picture
of the graph in ``docs/architecture.md``, come from ``scripts/architecture.py``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "scripts/architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["architecture"] = module
    spec.loader.exec_module(module)
    return module


arch = _load()
GRAPH = arch.imports()


def test_every_module_has_a_layer():
    for module in GRAPH:
        arch.layer_of(module)  # raises for a module in no layer


def test_no_module_imports_a_layer_above_its_own():
    assert arch.violations(GRAPH) == []


def test_no_import_circles_among_production_modules():
    """Measured from the imports (every one, inside functions too): no strongly connected
    component of more than one production module (``testing`` left out)."""
    assert arch.circles(GRAPH) == []


def test_a_circle_is_caught(tmp_path, monkeypatch):
    pkg = tmp_path / "jupyter_gpumem"
    (pkg / "model").mkdir(parents=True)
    (pkg / "model" / "a.py").write_text("from .b import B\n")
    (pkg / "model" / "b.py").write_text("def f():\n    from .c import C\n")
    (pkg / "model" / "c.py").write_text("from jupyter_gpumem.model import a\n")
    (pkg / "model" / "d.py").write_text("from .a import A\n")
    (pkg / "testing").mkdir()
    (pkg / "testing" / "x.py").write_text("from ..model import d\n")
    (pkg / "model" / "e.py").write_text("from ..testing import x\n")
    monkeypatch.setattr(arch, "PACKAGE", pkg)
    monkeypatch.setattr(arch, "_TOP", {"model", "testing"})
    assert arch.circles(arch.imports()) == [["model.a", "model.b", "model.c"]]


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("model.cell", "from ..collectors import Collector\n", "a layer above"),
        ("analysis.who", "def f():\n    from ..core.history import History\n", "a layer above"),
        ("collectors.nvml", "import jupyter_gpumem._ipython.session\n", "a layer above"),
        ("core.tracker", "from ..testing.replay import ReplayBackend\n", "test-only"),
        ("reporters.text", "from jupyter_gpumem.protocol import schema\n", "a layer above"),
        ("protocol.handler", "from .. import widget\n", "a layer above"),
    ],
)
def test_an_upward_import_is_caught(tmp_path, monkeypatch, module, source, expected):
    """The check reads every import form (relative, absolute, inside functions)."""
    pkg = tmp_path / "jupyter_gpumem"
    path = pkg / (module.replace(".", "/") + ".py")
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(arch, "PACKAGE", pkg)
    found = arch.violations(arch.imports())
    assert len(found) == 1 and expected in found[0], found


def test_the_picture_in_the_docs_is_current():
    assert arch.PICTURE.read_text() == arch.svg(GRAPH), (
        "docs/architecture.svg is stale: run `make architecture`"
    )


def test_the_docs_name_every_layer():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert "architecture.svg" in doc
    for name, _, members in arch.LAYERS:
        assert name in doc
        for m in members:
            if not m.startswith("__"):
                assert f"`{m}" in doc, m


def test_no_production_module_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "jupyter_gpumem").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


PACKAGES = ("collectors/dry_run", "analysis/caching")


def test_the_dry_run_and_the_allocator_model_share_no_private_names():
    """Their modules import no ``_name`` from one another, and the rest of the package
    reaches them through their ``__init__`` only."""
    import ast

    private, reached = [], []
    for p in (ROOT / "jupyter_gpumem").rglob("*.py"):
        rel = str(p.relative_to(ROOT / "jupyter_gpumem"))
        inside = next((pkg for pkg in PACKAGES if rel.startswith(pkg + "/")), None)
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            if inside is not None and node.level == 1:
                private += [f"{rel}: {a.name}" for a in node.names if a.name.startswith("_")]
            dotted = node.module.replace(".", "/")
            for pkg in PACKAGES:
                if inside != pkg and dotted.endswith(pkg + "/" + dotted.split("/")[-1]):
                    if dotted.split("/")[-1] != pkg.split("/")[-1]:
                        reached.append(f"{rel}: from {node.module}")
    assert private == [] and reached == []
