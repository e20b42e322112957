"""What counts as running out of GPU memory (errors.is_out_of_memory): one rule, the same
for an exception caught in the kernel and for one known by its name and message (as
``jupyter-gpumem run`` gets it from the kernel)."""

from __future__ import annotations

import pytest

from jupyter_gpumem.errors import is_out_of_memory, is_out_of_memory_text


class OutOfMemoryError(RuntimeError):
    """Named as torch's is: the name decides, torch is never imported for it."""


class BackendCompilerFailed(RuntimeError):
    pass


class Unprintable(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("no message")


OOM = [
    OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    OutOfMemoryError(""),
    RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total)"),
    RuntimeError("HIP out of memory. Tried to allocate 20.00 MiB"),
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported later"),
    RuntimeError("Caught OutOfMemoryError in DataLoader worker process 0.\nCUDA out of memory."),
    BackendCompilerFailed("backend='inductor' raised:\nOutOfMemoryError: CUDA out of memory."),
]
NOT_OOM = [
    MemoryError("counting backend: out of memory on device 0"),
    RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 GB"),
    RuntimeError("out of memory"),
    ValueError("batch must be positive"),
    KeyboardInterrupt(),
    Unprintable(),
]


@pytest.mark.parametrize("error", OOM, ids=lambda e: type(e).__name__)
def test_out_of_memory(error):
    assert is_out_of_memory(error)


@pytest.mark.parametrize("error", NOT_OOM, ids=lambda e: type(e).__name__)
def test_not_out_of_memory(error):
    assert not is_out_of_memory(error)


def test_no_error_is_none():
    assert not is_out_of_memory(None)


@pytest.mark.parametrize("error", OOM + NOT_OOM[:-1], ids=lambda e: type(e).__name__)
def test_by_name_and_message_as_in_the_kernel(error):
    """The text form (what a kernel reports) gives the same answer as the exception."""
    assert is_out_of_memory_text(type(error).__name__, str(error)) == is_out_of_memory(error)
