"""Every error jupyter-gpumem raises on purpose, in one place.

Each carries a message in the user's words; front ends turn them into what their users
see (IPython's ``UsageError``, a protocol error reply, a CLI exit code). Two never reach a
user as they are: :class:`Invalid` becomes a ``bad_request`` reply, :class:`KernelLost` a
note of ``jupyter-gpumem run``.

The package's public functions (``jupyter_gpumem.who()`` and the others) raise
:class:`GpuMemError` or one of its public subclasses, :class:`NotLoadedError` and
:class:`NoGpuError`, exported by the package; the others are the front ends' business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import ScanRun


class GpuMemError(RuntimeError):
    """Base of the errors below; what a public function raises when it cannot answer,
    with one sentence that says what is missing."""


class NotLoadedError(GpuMemError):
    """A public function that reads the kernel's session, called before
    ``%load_ext jupyter_gpumem``."""


class NoGpuError(GpuMemError):
    """A public function that needs PyTorch's GPU memory, where there is none: torch is
    not imported, is a CPU-only build, or finds no GPU."""


class ActionRefused(GpuMemError):
    """A valid request that cannot be done now (no torch, no such device, ...)."""


class ProtocolError(GpuMemError):
    """A request the kernel protocol refuses; ``code`` is schema.json's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Invalid(GpuMemError, ValueError):
    """Where and why a value does not match its schema (``protocol/validate.py``)."""

    def __init__(self, where: str, why: str) -> None:
        # "fraction must be <= 1, got 1.5"; "set_caching: missing argument 'enabled'"
        joint = " " if why.startswith(("must ", "is ", "has ", "matches ")) else ": "
        super().__init__(f"{where}{joint}{why}" if where else why)
        self.where = where
        self.why = why


class ScanStopped(GpuMemError):
    """A scan could not go on: the runs so far, the exception a run raised, and why."""

    def __init__(self, runs: Sequence[ScanRun], error: BaseException | None, why: str) -> None:
        super().__init__(why)
        self.runs = tuple(runs)
        self.error = error


class BudgetError(GpuMemError, ValueError):
    """A budget that does not parse; the message shows the accepted form."""


class RunError(GpuMemError):
    """A notebook could not be run (``jupyter-gpumem run`` exits 2); the message says why."""


class CliUsageError(GpuMemError):
    """Bad command-line arguments (``jupyter-gpumem run`` exits 2)."""


class KernelLost(GpuMemError):
    """The kernel stopped answering jupyter-gpumem's requests during a notebook run (the
    notebook unloaded the extension?): later cells get no figures."""
