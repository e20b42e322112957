"""Ops that reach the recorder whole where the real run splits them. Under
``torch.inference_mode`` (no autograd key to split them first) a composite op such as
``aten.linear``, ``aten.matmul`` or ``aten.layer_norm`` comes to the dispatch modes as it
is; the fake mode would then run it inside itself and record its output only, hiding the
parts' temporaries (a non-contiguous input's copy, ``native_layer_norm``'s mean and rstd)
and the cuBLAS calls among them. :class:`Composites` says which ops have a C++ composite
kernel, for the recorder to run that kernel with itself on, each part recorded.

``aten.dropout`` is one, with a Python decomposition beside it that clones its input when
it does nothing; ATen's ``_dropout_impl`` returns the input itself then (not training,
p = 0, an empty input): :func:`dropout_is_identity`."""

from __future__ import annotations

from typing import Any

_DROPOUTS = ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")


class Composites:
    """``device_type``: the run's device; an op with a kernel of its own for that device's
    backend (``silu_backward`` on CUDA) runs that kernel for real, not its composite one."""

    def __init__(self, t: Any, device_type: str = "cuda") -> None:
        self.key = t._C.DispatchKey.CompositeImplicitAutograd
        self._has = t._C._dispatch_has_kernel_for_dispatch_key
        backend = {"cuda": "CUDA", "cpu": "CPU"}.get(device_type, device_type.upper())
        self._own = (
            "CompositeExplicitAutograd",
            "CompositeExplicitAutogradNonFunctional",
            backend,
        )
        self._known: dict[Any, bool] = {}
        # only under inference mode: elsewhere a composite reaches the recorder whole only
        # inside autograd's backward formulas, where the fake mode's handling of it was
        # measured exact on every training step (tests/gpu/dry_run_cases.py)
        self.inference: Any = t.is_inference_mode_enabled
        aten = t.ops.aten
        self.dropouts = frozenset(
            getattr(aten, name).default for name in _DROPOUTS if hasattr(aten, name)
        )

    def __call__(self, func: Any) -> bool:
        """Whether ``func`` is an aten op whose C++ composite kernel is what runs."""
        known = self._known.get(func)
        if known is None:
            try:
                name = func.name()
                known = (
                    getattr(func, "namespace", "") == "aten"
                    and bool(self._has(name, self.key))
                    and not any(self._has(name, k) for k in self._own)
                )
            except Exception:  # an op the dispatcher does not know by name (prim::device)
                known = False
            self._known[func] = known
        return known


def dropout_is_identity(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a dropout call (input, p, train) returns its input: not training, p = 0, or
    an empty input (one activation-sized clone per dropout otherwise, as the fake mode's
    decomposition makes)."""
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    train = kwargs.get("train", args[2] if len(args) > 2 else True)
    return not train or p == 0 or args[0].numel() == 0
