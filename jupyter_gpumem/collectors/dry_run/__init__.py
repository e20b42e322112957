"""The dry run: the user's code under PyTorch's ``FakeTensorMode``, every storage it
allocates and frees recorded in order, no device memory used, no kernel run and nothing
real changed (``record``; ``analysis/caching`` replays the events through the caching
allocator's model, ``core/dry_run.py`` makes the prediction).

Others import from this package only. Its modules, one part each:

- ``run``: :func:`record`, the entry: the run under the fake mode, what is put back after;
- ``events``: what a run records (:class:`Alloc`, :class:`Free`, :class:`Seen`,
  :class:`Stopped`, :class:`FakeRun`): plain records, no torch;
- ``state``: the per-run state that sees storages born and die, and the user's real
  tensors replaced by fake copies (the recorder, a dispatch mode above the fake mode);
- ``guard``: what a run refuses outside the process (files, processes, connections) and
  lists as not undone (iterators, prints);
- ``keep``: the user's objects and torch's switches, put back after the run;
- ``values``: the small values a run knows (a loop's flags and counters);
- ``shapes``: outputs whose size depends on values, sized exactly or as the worst case;
- ``workspaces``: cuBLAS's workspaces by card, ops with scratch memory; ``conv`` and
  ``cudnn``: cuDNN convolutions' workspaces, asked of cuDNN's heuristics; ``attention``:
  fused attention's temporaries; ``composite``: composite ops split into their parts;
- ``kernels``, ``rnn``, ``rnn_sizes``: fake kernels for ops whose own fail or refuse what
  the real op runs (``_grouped_mm``, cuDNN RNNs);
- ``patches``: what a run changes in torch while it runs so that it takes the real run's
  path (foreach optimizers, moving modules, tensors from data, a linear layer's bias);
- ``watch``: the breakdown's hooks (their phases and modules tracked by
  ``collectors/phases.py``); ``where``: the user's line; ``group``: a fake process group
  for a run of several ranks.
"""

from .events import (
    Alloc,
    AllocKind,
    Event,
    Events,
    FakeRun,
    Free,
    PhaseMark,
    PhaseName,
    Saved,
    Seen,
    StopKind,
    Stopped,
)
from .group import ENVIRONMENT, MAX_WORLD_SIZE, STARTED_CUDA, check_world_size, fake_job, refusal
from .guard import Refused
from .run import record
from .state import HELD
from .workspaces import (
    OTHER_CARDS,
    WORKSPACE_TABLE,
    Workspaces,
    capability,
    cuda_workspaces,
    parse_workspace_config,
)

__all__ = [
    "ENVIRONMENT",
    "HELD",
    "MAX_WORLD_SIZE",
    "OTHER_CARDS",
    "STARTED_CUDA",
    "WORKSPACE_TABLE",
    "Alloc",
    "AllocKind",
    "Event",
    "Events",
    "FakeRun",
    "Free",
    "PhaseMark",
    "PhaseName",
    "Refused",
    "Saved",
    "Seen",
    "StopKind",
    "Stopped",
    "Workspaces",
    "capability",
    "check_world_size",
    "cuda_workspaces",
    "fake_job",
    "parse_workspace_config",
    "record",
    "refusal",
]
