"""The recorder: a ``TorchDispatchMode`` above the fake mode that sees each op of a dry run.
Before the op, the user's real tensors among its arguments are replaced by their fake
copies (``State.fake_inputs``); a value read to the host is answered (``State.host_read``);
a size that depends on values is sized (``State.size_by_values``); a dropout that does
nothing returns its input, as ATen's does (the fake mode's decomposition clones it); after
it, the op's new storages are recorded (``State.see_outputs``) and its small known values
kept. A composite op (``aten.linear``, ``aten.matmul``, ``aten.layer_norm``), which reaches
the recorder whole under ``torch.inference_mode`` (no autograd key splits it first), is
run as its C++ composite kernel with the recorder on (``composite``), so that each part's
storages are recorded, temporaries included, and the cuBLAS calls among them add their
workspaces. Every
:data:`~jupyter_gpumem.collectors.dry_run.state.CLOCK_EVERY` ops the state looks at the
clock (progress, the time budget)."""

from __future__ import annotations

from typing import Any

from .composite import Composites, dropout_is_identity
from .state import CLOCK_EVERY, State

_RECORDER: Any = None


def recorder_class() -> Any:
    """The dispatch mode's class, made on first use (its base class is torch's)."""
    global _RECORDER
    if _RECORDER is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Recorder(TorchDispatchMode):
            def __init__(self, state: State) -> None:
                super().__init__()
                self.state = state
                self.composite = Composites(state.t, state.device_type)

            def __torch_dispatch__(
                self,
                func: Any,
                types: Any,
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                state = self.state
                kwargs = kwargs or {}
                if state.wrapped(types):
                    # a tensor subclass that wraps others (DTensor): its own ops run on its
                    # local tensors and come back here at their real, sharded sizes
                    return NotImplemented
                state.ops += 1
                if not state.ops % CLOCK_EVERY:
                    state.clock()
                if func not in state.lifts:  # torch.tensor(data)'s fresh tensor: not the user's
                    args, kwargs = state.fake_inputs(args, kwargs)
                composite = self.composite
                if func in composite.dropouts and dropout_is_identity(args, kwargs):
                    return args[0]  # ATen's dropout returns its input itself here
                if composite.inference() and composite(func):
                    # a composite op reached here whole (inference mode skips autograd,
                    # where it is split): its C++ parts, each recorded, as the real run
                    # makes them (the fake mode would hide what they take and give back)
                    with self:
                        return func._op_dk(composite.key, *args, **kwargs)
                if func is state.scalar_read and args and isinstance(args[0], state.fake_type):
                    try:  # a constant the fake mode knows (AdamW's step count) it answers
                        return func(*args, **kwargs)
                    except state.data_dependent:
                        return state.host_read(args[0])
                try:
                    if func in state.presized:  # the fake mode would run it on the device
                        out = state.size_by_values(func, args, kwargs, None)
                    else:
                        out = func(*args, **kwargs)
                except (state.dynamic_shape, state.data_dependent) as e:
                    out = state.size_by_values(func, args, kwargs, e)
                except Exception as e:
                    state.failed = (func, e)
                    raise
                state.see_outputs(func, out, args, kwargs)
                state.values.after(func, args, kwargs, out)
                return out

        _RECORDER = Recorder
    return _RECORDER
