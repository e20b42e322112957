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
    res, _, cap = run(no_torch, "%%gpumem --dry-run\nnever_bound = 1")
    assert cap.stderr == (
        "UsageError: --dry-run needs torch and a CUDA GPU: torch is not installed in this "
        f"kernel; {pip_hint()}; the cell did not run\n"
    )
    assert cap.stdout == "" and type(res.error_in_exec).__name__ == "UsageError"
    assert "import torch" not in cap.stderr
    assert "never_bound" not in no_torch.user_ns


def test_scan_says_the_same(no_torch):
    _, _, cap = run(no_torch, "%%gpumem --scan batch=16,32\nnever_bound = batch")
    assert cap.stderr == (
        "UsageError: --scan needs torch and a CUDA GPU: torch is not installed in this "
        f"kernel; {pip_hint()}; the cell did not run\n"
    )
    assert "never_bound" not in no_torch.user_ns


# -- a Python the system manages (PEP 668: Debian's, Ubuntu's) ---------------------------
@pytest.mark.parametrize(
    ("marked", "in_venv", "managed"),
    [(True, False, True), (True, True, False), (False, False, False), (False, True, False)],
)
def test_externally_managed_is_the_marker_outside_a_venv(tmp_path, marked, in_venv, managed):
    from jupyter_gpumem.collectors.torch_build import externally_managed

    if marked:
        (tmp_path / "EXTERNALLY-MANAGED").write_text("[externally-managed]\n")
    assert externally_managed(str(tmp_path), in_venv) is managed


def test_this_python_is_asked_where_pip_looks():
    import sysconfig
    from pathlib import Path

    from jupyter_gpumem.collectors.torch_build import externally_managed

    marker = Path(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED").is_file()
    assert externally_managed() is (marker and sys.prefix == sys.base_prefix)


VENV_HINT = (
    "this Python is the system's (externally managed, PEP 668), so pip will not install "
    "into it: make a virtual environment (python3 -m venv ENV), install torch into it as "
    "PyTorch's instructions say for your CUDA version, with ipykernel and jupyter-gpumem, "
    "and run the notebook on its kernel (ENV/bin/python -m ipykernel install --user "
    "--name ENV)"
)


def test_the_hint_for_a_managed_python_is_a_virtual_environment():
    from jupyter_gpumem.collectors.torch_build import install_hint

    assert install_hint("/usr/bin/python3", managed=True) == VENV_HINT
    assert install_hint("/usr/bin/python3", managed=False) == (
        "install it as PyTorch's instructions say for your CUDA version, "
        "e.g. /usr/bin/python3 -m pip install torch"
    )


def test_a_kernel_on_a_managed_python_is_told_to_make_a_venv(no_torch, monkeypatch):
    from jupyter_gpumem.collectors import torch_build

    monkeypatch.setattr(torch_build, "externally_managed", lambda *a, **k: True)
    _, _, cap = run(no_torch, "%%gpumem --dry-run\nnever_bound = 1")
    assert cap.stderr == (
        "UsageError: --dry-run needs torch and a CUDA GPU: torch is not installed in this "
        f"kernel; {VENV_HINT}; the cell did not run\n"
    )
    assert "pip install torch" not in cap.stderr


# -- make lab's note of which torch .venv sees (scripts/which_torch.py) -------------------
def _which_torch():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "which_torch.py"
    spec = importlib.util.spec_from_file_location("which_torch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines, prints nothing (main() prints)
    return module


def test_make_lab_without_torch_names_the_python_to_install_it_into():
    which = _which_torch()
    assert which.no_torch("/usr", managed=False) == (
        "torch: none in this environment. The demo needs none (make demo); for your own "
        "notebooks, install torch into the Python that made .venv (/usr), as PyTorch's "
        "instructions say for your CUDA version, then rerun make lab."
    )


def test_make_lab_on_a_managed_python_says_to_install_torch_into_venv():
    which = _which_torch()
    assert which.no_torch("/usr", managed=True) == (
        "torch: none in this environment. The demo needs none (make demo). The Python that "
        "made .venv (/usr) is the system's (externally managed, PEP 668), so pip will not "
        "install into it: for your own notebooks, install torch into .venv itself, as "
        "PyTorch's instructions say for your CUDA version (.venv/bin/python -m pip install "
        "...), then rerun make lab."
    )
