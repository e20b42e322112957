"""Issue 13's ``who`` case, one definition for its benchmark and probes (GPU machine): an
IPython shell with 10k live CUDA tensors whose allocation sites are tracked, and, once
``add_junk`` ran, 100k other objects in the namespace (50k dicts, each with a list).

Imported as ``who_case`` by the scripts in this folder, as ``probes.who_case`` by those
in ``benchmarks/``.
"""

from __future__ import annotations

from typing import Any

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

SETUP = (
    "import torch\ntorch.empty(0, device='cuda')",
    "%load_ext jupyter_gpumem",
    "%gpumem track on",
    "acts = [torch.empty(4096, device='cuda') for _ in range(10_000)]",
)
JUNK = "junk = [{'i': i, 'v': [i, str(i)]} for i in range(50_000)]"


def who_shell(junk: bool = False) -> tuple[InteractiveShell, Any]:
    """The shell with the case set up, and its session's ``Who`` service."""
    ip = InteractiveShell.instance()
    with capture_output():
        for cell in SETUP:
            ip.run_cell(cell)
    if junk:
        add_junk(ip)
    from jupyter_gpumem._ipython import current

    return ip, current().who


def add_junk(ip: InteractiveShell) -> None:
    with capture_output():
        ip.run_cell(JUNK)
