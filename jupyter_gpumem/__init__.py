"""jupyter-gpumem: what each notebook cell did to GPU memory, exactly and cheaply.

``%load_ext jupyter_gpumem`` (or ``%load_ext gpumem``), then ``%%gpumem`` on a cell or
``%gpumem auto on``. Importing this package imports neither torch nor IPython.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__


def load_ipython_extension(ipython: Any) -> None:
    from ._ipython import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from ._ipython import unload

    unload(ipython)


def history(n: int | None = None) -> Any:
    """The measured cells of this kernel as a pandas DataFrame (one row per cell and
    device; the last ``n`` cells when given)."""
    from ._ipython import current

    session = current()
    if session is None:
        raise RuntimeError("the gpumem extension is not loaded: run %load_ext jupyter_gpumem")
    return session.history.dataframe(n)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_gpumem"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from ._server import load

    load(serverapp)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-gpumem"}]


__all__ = ["__version__", "history", "load_ipython_extension", "unload_ipython_extension"]
