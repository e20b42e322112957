"""Outputs whose size depends on values: ``nonzero`` (``torch.where(mask)``), boolean-mask
indexing (``x[mask]``), ``masked_select`` and CTC loss (its ``log_alpha`` is as long as the
longest target). PyTorch's fake mode cannot size them (it has
no values) and raises; a dry run sizes them instead, and says how:

- *exactly* when the mask's values are known (made of constants: ``values``);
- else as the *worst case*, every element selected: the most memory the op can take. A
  mixture-of-experts layer that loops over experts and picks each one's tokens with
  ``torch.where(expert_mask[e])`` is then planned as if every token went to every expert,
  an upper bound of what any routing needs (a balanced router sends each expert about
  ``tokens × top_k / experts``).

Used by the recorder (``collectors/dry_run/state.py``) when the fake mode raises
``DynamicOutputShapeException``; the output is made with the fake mode, as any op's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

EXACT = "exactly (the mask's values are known)"
WORST = "as the worst case: every element selected"


def sized(
    t: Any,
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    known: Callable[[Any], Any],
) -> tuple[Any, str] | None:
    """The op's output, sized exactly or as the worst case, and which (None: not an op
    this sizes)."""
    from torch.utils._mode_utils import no_dispatch

    def selected(values: Any, shape: Any = None) -> int:
        with no_dispatch():  # known values are real CPU tensors: counted for real
            return int((values if shape is None else values.expand(shape)).count_nonzero())

    aten = t.ops.aten
    if func is aten.nonzero.default:
        x = args[0]
        values = known(x)
        n = selected(values) if values is not None else x.numel()
        return x.new_empty((n, x.dim()), dtype=t.long), EXACT if values is not None else WORST
    if func is aten.masked_select.default:
        x, mask = args[0], args[1]
        values = known(mask)
        shape = t.broadcast_shapes(x.shape, mask.shape)
        if values is not None:
            n = selected(values, shape)
        else:
            n = 1
            for d in shape:
                n *= d
        return x.new_empty((n,)), EXACT if values is not None else WORST
    if func is aten.index.Tensor:
        x, indices = args[0], list(args[1])
        masks = [i for i in indices if i is not None and i.dtype in (t.bool, t.uint8)]
        if len(masks) != 1 or indices[0] is not masks[0]:
            return None  # one leading boolean mask only: other mixes keep torch's answer
        mask = masks[0]
        if len(indices) > 1 and any(i is not None for i in indices[1:]):
            return None
        values = known(mask)
        n = selected(values) if values is not None else mask.numel()
        rest = tuple(x.shape[mask.dim() :])
        return x.new_empty((n, *rest)), EXACT if values is not None else WORST
    if func is aten._ctc_loss.Tensor:
        # (neg_log_likelihood (N,), log_alpha (N, T, 2 * longest target + 1)), as
        # ctc_loss_gpu_template makes them; the longest target is read from the lengths
        log_probs, targets, target_lengths = args[0], args[1], args[3]
        values = known(target_lengths)
        if values is not None:
            with no_dispatch():
                longest = int(values.max()) if values.numel() else 0
        else:  # one target as long as the targets allow
            longest = targets.shape[1] if targets.dim() == 2 else targets.numel()
        batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
        nll = log_probs.new_empty((batch,))
        alpha = log_probs.new_empty((batch, log_probs.shape[0], 2 * longest + 1))
        how = EXACT if values is not None else "as the worst case: the longest target possible"
        return (nll, alpha), how
    if func is aten._ctc_loss_backward.Tensor:  # the gradient is log_probs' size
        return args[1].new_empty(args[1].shape), EXACT
    return None
