"""Sources named by environment variables: how tests and demos plug in recorded ones.

Each source is the real one unless an environment variable names another of the same
records by import path (``package.module:callable``, called without arguments; tests plug
theirs in this way: ``jupyter_gpumem.testing``): :data:`BACKEND_ENV` the allocator's and
the driver's figures (a :class:`~.collector.Backend`), :data:`NVML_ENV` pynvml's calls,
:data:`ATTRIBUTION_ENV` who holds the memory (an ``AttributionSource``, which the session
gives its ``Attributor`` when it is composed). Read once, where a session, a backend or
an NVML binding is made.
"""

from __future__ import annotations

import os
from typing import Any

BACKEND_ENV = "JUPYTER_GPUMEM_BACKEND"
NVML_ENV = "JUPYTER_GPUMEM_NVML"
ATTRIBUTION_ENV = "JUPYTER_GPUMEM_ATTRIBUTION"


def plugged(variable: str) -> Any:
    """What the ``package.module:callable`` named in environment variable ``variable``
    makes; None when the variable is unset."""
    spec = os.environ.get(variable)
    return load_plugin(spec, variable) if spec else None


def load_plugin(spec: str, variable: str) -> Any:
    """Call the ``package.module:callable`` that ``spec`` names; a clear error otherwise."""
    import importlib

    module, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise RuntimeError(f"{variable}={spec!r}: cannot load it ({e})") from None
    return factory()
