from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def shell():
    """One real IPython InteractiveShell for the whole run."""
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


@pytest.fixture
def ip(shell):
    """The shell with the extension freshly loaded; unloaded (and checked) afterwards."""
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    yield shell
    shell.run_line_magic("unload_ext", "jupyter_gpumem")


def run(shell, code: str):
    """Run a cell, capturing its display outputs: (result, [text/plain of each display])."""
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        result = shell.run_cell(code)
    texts = [o.data.get("text/plain", "") for o in cap.outputs]
    return result, texts, cap
