"""Test doubles, plugged in through the same interfaces as the real collectors.

- :mod:`.replay`: a backend that replays allocator readings recorded on a real GPU
  (``JUPYTER_GPUMEM_BACKEND`` names it), and the attribution recorded beside them
  (``JUPYTER_GPUMEM_ATTRIBUTION`` names it).
- :mod:`.fake_nvml`: pynvml's calls answered from a file; ``JUPYTER_GPUMEM_NVML`` names it.

No production module imports this package: the environment variables name a factory by
import path (``package.module:callable``), which :func:`jupyter_gpumem.collectors.plugged`
calls.
"""
