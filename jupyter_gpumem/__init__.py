"""jupyter-gpumem: what each notebook cell did to GPU memory, exactly and cheaply.

``%load_ext jupyter_gpumem`` (or ``%load_ext gpumem``), then ``%%gpumem`` on a cell or
``%gpumem auto on``. Importing this package imports neither torch nor IPython.

The public functions live in :mod:`jupyter_gpumem.api`, the errors they raise in
:mod:`jupyter_gpumem.errors`; this module only names them.
"""

from ._version import __version__
from .api import _jupyter_labextension_paths as _jupyter_labextension_paths
from .api import _jupyter_server_extension_points as _jupyter_server_extension_points
from .api import _load_jupyter_server_extension as _load_jupyter_server_extension
from .api import (
    breakdown,
    dry_run,
    free,
    history,
    load_ipython_extension,
    report_to_store,
    report_worker,
    scan,
    unload_ipython_extension,
    watch_store,
    who,
)
from .errors import GpuMemError, NoGpuError, NotLoadedError

__all__ = [
    "GpuMemError",
    "NoGpuError",
    "NotLoadedError",
    "__version__",
    "breakdown",
    "dry_run",
    "free",
    "history",
    "load_ipython_extension",
    "report_to_store",
    "report_worker",
    "scan",
    "unload_ipython_extension",
    "watch_store",
    "who",
]
