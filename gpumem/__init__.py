"""Short alias so that ``%load_ext gpumem`` works; everything lives in ``jupyter_gpumem``."""

from jupyter_gpumem import (  # noqa: F401
    __version__,
    breakdown,
    history,
    load_ipython_extension,
    scan,
    unload_ipython_extension,
    who,
)
