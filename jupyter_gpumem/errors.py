"""Every error jupyter-gpumem raises on purpose, in one place.

Each carries a message in the user's words; front ends turn them into what their users
see (IPython's ``UsageError``, a protocol error reply, a CLI exit code). Two never reach a
user as they are: :class:`Invalid` becomes a ``bad_request`` reply, :class:`KernelLost` a
note of ``jupyter-gpumem run``.

The package's public functions (``jupyter_gpumem.who()`` and the others) raise
:class:`GpuMemError` or one of its public subclasses, :class:`NotLoadedError` and
:class:`NoGpuError`, exported by the package; the others are the front ends' business.

Also here, as the one rule every part of the tool applies to the errors a user's code
raises: what counts as running out of GPU memory (:func:`is_out_of_memory`, and
:func:`is_out_of_memory_text` for an error known only by its name and message).
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


class DiffInputError(GpuMemError, ValueError):
    """A run document or a tolerance that a comparison of runs cannot use (not a
    ``jupyter-gpumem run`` document, a version it does not read, ``1`` for ``1%``); the
    message says what was expected."""


class RunError(GpuMemError):
    """A notebook could not be run (``jupyter-gpumem run`` exits 2); the message says why."""


class CliUsageError(GpuMemError):
    """Bad command-line arguments (``jupyter-gpumem run`` exits 2)."""


class KernelLost(GpuMemError):
    """The kernel stopped answering jupyter-gpumem's requests during a notebook run (the
    notebook unloaded the extension?): later cells get no figures."""


# -- what counts as running out of GPU memory -------------------------------------------------

OOM_NAME = "OutOfMemoryError"  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
# The caching allocator's own words (older torch raised them in a plain RuntimeError; on
# ROCm they say HIP), and the driver's when a CUDA call itself finds no memory.
OOM_WORDS = ("CUDA out of memory", "HIP out of memory", "CUDA error: out of memory")


def is_out_of_memory_text(name: str, text: str) -> bool:
    """Whether an exception, known only by its type's name and its message (as a kernel
    reports it to ``jupyter-gpumem run``), is running out of GPU memory.

    The one definition, for every part of the tool: the exception's type is named
    ``OutOfMemoryError`` (``torch.OutOfMemoryError`` is ``torch.cuda.OutOfMemoryError``;
    the name, not the class, so that torch need not be imported and a report from another
    process reads the same), or its message holds one of :data:`OOM_WORDS`: torch before
    1.13 raised the allocator's ``CUDA out of memory. Tried to allocate ...`` in a plain
    ``RuntimeError``, ROCm builds say ``HIP``, wrappers repeat it (a DataLoader worker's
    ``RuntimeError``, ``torch.compile``'s ``BackendCompilerFailed``), and
    ``CUDA error: out of memory`` is the driver's own refusal (a context, a library's
    workspace). Other errors that mention memory (the host's ``MemoryError``, a
    ``RuntimeError`` of the CPU allocator) are not."""
    return name == OOM_NAME or any(words in text for words in OOM_WORDS)


def is_out_of_memory(error: BaseException | None) -> bool:
    """Whether ``error`` (None: no error) is running out of GPU memory, by the rule of
    :func:`is_out_of_memory_text` on its type's name and its message. A message that
    cannot be made (a broken ``__str__``) counts as none."""
    if error is None:
        return False
    name = type(error).__name__
    if name == OOM_NAME:
        return True
    try:
        text = str(error)
    except Exception:
        return False
    return is_out_of_memory_text(name, text)
