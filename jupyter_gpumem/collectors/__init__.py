"""Collectors: the only code that talks to torch, NVML, /proc, the user's namespace and
worker processes.

``Collector.measure()`` returns one :class:`~jupyter_gpumem.model.Measurement`; everything
else in the package works from those records. Where each source is read:

- :mod:`.collector`: :class:`Collector` and the :class:`Backend` protocol it reads
  (:func:`make_backend` picks the real one or the plugged one);
- :mod:`.plugins`: the environment variables that plug in recorded sources;
- :mod:`.allocator`: PyTorch's caching allocator and the driver (:class:`TorchBackend`),
  :mod:`.readings` the conversion of their raw figures into records, :mod:`.nvml` NVML,
  :mod:`.host` the host's memory and process names;
- :mod:`.snapshot`, :mod:`.step`, :mod:`.phase_peaks`: torch's snapshots and traces, the
  hooks of ``--breakdown`` and ``--scan``; :mod:`.phases`: the phases of a training step
  and the modules running in it, tracked for those two and the dry run's breakdown;
- :mod:`.namespace` (with :mod:`.namespace_kinds`, :mod:`.namespace_reach`,
  :mod:`.namespace_bulk`): who holds GPU tensors in the user's namespace;
- :mod:`.workers` (forked and spawned workers), :mod:`.distributed` (ranks, through a
  ``torch.distributed`` store), :mod:`.ray_workers` (Ray workers): other processes'
  figures.

The package's own modules import each other directly, never this ``__init__``; it only
names what the layers above use.
"""

from __future__ import annotations

from .allocator import TorchBackend
from .collector import Backend, Collector, make_backend
from .plugins import ATTRIBUTION_ENV, BACKEND_ENV, NVML_ENV, load_plugin, plugged
from .readings import Reading

__all__ = [
    "ATTRIBUTION_ENV",
    "BACKEND_ENV",
    "NVML_ENV",
    "Backend",
    "Collector",
    "Reading",
    "TorchBackend",
    "load_plugin",
    "make_backend",
    "plugged",
]
