"""A kernel whose Python has no torch at all: the options that need torch say it is not
installed and how to install it, not to import it (importing would fail)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import run


@pytest.fixture
def no_torch(ip, monkeypatch):
    # `import torch` and importlib's find_spec both answer "no torch" for a None entry
    monkeypatch.setitem(sys.modules, "torch", None)
    return ip


def pip_hint() -> str:
    return (
        "install it as PyTorch's instructions say for your CUDA version, "
        f"e.g. {sys.executable} -m pip install torch"
    )


def test_dry_run_says_torch_is_not_installed(no_torch):
    _, _, cap = run(no_torch, "%%gpumem --dry-run\nnever_bound = 1")
    assert cap.stdout == (
        "gpumem: --dry-run needs torch and a CUDA GPU: torch is not installed in this "
        f"kernel; {pip_hint()}; the cell did not run\n"
    )
    assert "import torch" not in cap.stdout
    assert "never_bound" not in no_torch.user_ns


def test_scan_says_the_same(no_torch):
    _, _, cap = run(no_torch, "%%gpumem --scan batch=16,32\nnever_bound = batch")
    assert cap.stderr == (
        "UsageError: --scan needs torch and a CUDA GPU: torch is not installed in this "
        f"kernel; {pip_hint()}; the cell did not run\n"
    )
    assert "never_bound" not in no_torch.user_ns
