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


def who(device: int | None = None, by: str = "variable", n: int | None = None) -> Any:
    """Who holds the live GPU memory of this kernel, as ``%gpumem who`` shows it: one row per
    owner (``by="variable"``), allocation line (``"line"``, needs ``%gpumem track on``) or
    cell (``"cell"``); the rows of a device add up to its ``allocated``.

    Returns a pandas DataFrame (columns ``device, by, key, detail, bytes, blocks, example,
    kind, site``) when pandas is installed, else the list of
    :class:`~jupyter_gpumem.model.WhoReport` records. Call it between cells, not from a
    thread while a cell runs.
    """
    from ._ipython import current

    session = current()
    if session is None:
        raise RuntimeError("the gpumem extension is not loaded: run %load_ext jupyter_gpumem")
    if by not in ("variable", "line", "cell"):
        raise ValueError(f"by must be 'variable', 'line' or 'cell', not {by!r}")
    reports = session.attributor.who(device, by, n)  # type: ignore[arg-type]
    try:
        import pandas as pd
    except ImportError:
        return reports
    records = [{"device": r.device, "by": r.by, **row.to_dict()} for r in reports for row in r.rows]
    columns = ["device", "by", "key", "detail", "bytes", "blocks", "example", "kind", "site"]
    return pd.DataFrame.from_records(records, columns=columns)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_gpumem"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from .server import load

    load(serverapp)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-gpumem"}]


__all__ = [
    "__version__",
    "history",
    "load_ipython_extension",
    "unload_ipython_extension",
    "who",
]
