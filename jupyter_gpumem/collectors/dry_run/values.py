"""The small values a dry run knows: a loop's bookkeeping tensors (a flag, a counter, a
mask of finished rows) whose values come from constants, kept beside their fake tensors
and computed for real on the CPU, so that a value read to the host that depends only on
them gets its real answer instead of 0 (``state.State.host_read``).

Why: Hugging Face's ``model.generate()`` ends its loop on
``bool(unfinished_sequences.max() == 0)``. ``unfinished_sequences`` starts as
``torch.ones(batch)``; ``MaxLengthCriteria`` returns ``torch.full((batch,), length >=
max_length)`` and the EOS check ``isin(last_token, eos)``, ORed, then
``unfinished & ~done``. Answered False for ever, the loop never ended (it would have
stopped at the 100,000th read, after hours; ``benchmarks/probes/probe_generate.py``).
With these values it ends at ``max_new_tokens``, as the real run does at the latest.

What is known:

- the outputs of factories whose values their arguments fix (``full``, ``ones``,
  ``zeros``, ``arange``, ``scalar_tensor``, ``linspace``, ``eye``; ``zeros_like``,
  ``ones_like``, ``full_like``, ``new_zeros``, ``new_ones``, ``new_full``, ``fill``), the
  user's small real CPU tensors (:meth:`KnownValues.seed`), torch's own constants
  (``torch.tensor(3)``) and ``torch.tensor(data)``'s fresh tensor;
- the outputs of an op whose tensor inputs are all known: computed for real, on the
  CPU whatever the fake tensor's device, on private copies;
- an op with an absorbing operand: ``x & known_false``, ``x * known_zero`` (integers and
  booleans: ``nan * 0`` is ``nan``), ``x | known_true`` are known whatever ``x`` is:
  ``max_length_done | eos_done`` is known at the last step although the EOS check's value
  is not.

Only tensors of at most :data:`LIMIT` elements: nothing big is computed (an op is computed
only when every output is that small too). A write into a storage (in place, ``out=``,
``copy_``, ``set_``, ``resize_``) forgets every value of that storage, views included,
unless the write itself was computed (its own output, then, is known again). Random ops,
``empty``, and ops outside ``aten`` and ``prims`` (collectives, custom ops) give nothing
known. What is not known is read as 0, as before.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any

LIMIT = 4096  # elements: the largest tensor whose values are kept

# factories whose first argument's values don't matter (only its shape and dtype)
_LIKE = frozenset(
    {"zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "fill"}
)
# in-place ops that overwrite their first argument whatever it held
_OVERWRITES = frozenset({"copy_", "fill_", "zero_"})
# factories without tensor inputs whose values their arguments fix
_FACTORIES = frozenset({"full", "ones", "zeros", "arange", "scalar_tensor", "linspace", "eye"})
# never known: uninitialised memory, and the read itself (``state`` answers it)
_NEVER = frozenset(
    {
        "empty",
        "empty_like",
        "new_empty",
        "new_empty_strided",
        "empty_strided",
        "empty_permuted",
        "_local_scalar_dense",
    }
)
_ZERO_ABSORBS = frozenset(
    {"bitwise_and", "logical_and", "mul", "bitwise_and_", "logical_and_", "mul_"}
)
_TRUE_ABSORBS = frozenset({"bitwise_or", "logical_or", "bitwise_or_", "logical_or_"})


class _Op:
    """What the values need to know of an op, found once per op."""

    __slots__ = ("arguments", "name", "skip", "written")

    def __init__(self, t: Any, func: Any) -> None:
        self.name = getattr(func, "_opname", str(func))
        schema = getattr(func, "_schema", None)
        tags = getattr(func, "tags", ())
        self.skip = (
            getattr(func, "namespace", "") not in ("aten", "prims")
            or t.Tag.nondeterministic_seeded in tags
            or t.Tag.inplace_view in tags  # shape changes in place: forgotten, not computed
            or self.name in _NEVER
        )
        arguments = schema.arguments if schema is not None else []
        self.arguments = [a.name for a in arguments]
        self.written = [
            i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
        ]


class KnownValues:
    """One dry run's known values: each a CPU tensor beside a fake tensor, held while the
    fake tensor lives (a weak reference), forgotten when its storage is written."""

    def __init__(self, t: Any, fake_type: type) -> None:
        from torch.utils._mode_utils import no_dispatch

        self.t = t
        self.fake_type = fake_type
        self.no_dispatch = no_dispatch
        self.known: dict[int, tuple[Any, Any, int]] = {}  # id(x) -> (ref, value, id(storage))
        self.by_storage: dict[int, set[int]] = {}  # id(storage) -> ids of its known tensors
        self.ops: dict[Any, _Op] = {}
        self.computed = 0  # ops computed on known values
        self.answered = 0  # values read to the host answered with a known value

    # -- the table ---------------------------------------------------------------------
    def value(self, x: Any) -> Any:
        """``x``'s values (a CPU tensor, not to be written), or None when not known."""
        entry = self.known.get(id(x))
        if entry is not None and entry[0]() is x:
            return entry[1]
        if isinstance(x, self.fake_type):
            c = getattr(x, "constant", None)  # torch's own (torch.tensor(3), step counts)
            if c is not None and c.device.type == "cpu" and c.numel() <= LIMIT:
                return c
            return None
        if isinstance(x, self.t.Tensor):  # torch.tensor(data)'s fresh real tensor
            try:
                small = x.layout == self.t.strided and x.numel() <= LIMIT
                return x if small and x.device.type == "cpu" else None
            except Exception:
                return None
        return None

    def item(self, value: Any) -> Any:
        with self.no_dispatch():
            return value.item()

    def seed(self, fake: Any, real: Any) -> None:
        """The fake copy of the user's small real CPU tensor has its values."""
        try:
            if real.device.type != "cpu" or real.layout != self.t.strided:
                return
            if real.numel() > LIMIT:
                return
            with self.no_dispatch():
                value = real.detach().clone()
        except Exception:
            return
        self._set(fake, value)

    def forget(self, x: Any) -> None:
        """Forget the values of every tensor on ``x``'s storage (``x``: a tensor, a
        storage, or a list of tensors)."""
        if isinstance(x, (list, tuple)):
            for y in x:
                self.forget(y)
            return
        try:
            st = x.untyped_storage() if isinstance(x, self.t.Tensor) else x
            sid = id(st)
        except Exception:
            return
        for key in list(self.by_storage.get(sid, ())):
            self._drop(key)

    def _set(self, x: Any, value: Any) -> None:
        try:
            sid = id(x.untyped_storage())
        except Exception:
            return
        key = id(x)
        self._drop(key)
        ref = weakref.ref(x, partial(self._dead, key))
        self.known[key] = (ref, value, sid)
        self.by_storage.setdefault(sid, set()).add(key)

    def _dead(self, key: int, ref: Any) -> None:
        entry = self.known.get(key)
        if entry is not None and entry[0] is ref:
            self._drop(key)

    def _drop(self, key: int) -> None:
        entry = self.known.pop(key, None)
        if entry is not None:
            keys = self.by_storage.get(entry[2])
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_storage[entry[2]]

    # -- after each op -----------------------------------------------------------------
    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """What ``func`` (run on the fake tensors, giving ``out``) makes known; what it
        wrote is forgotten first."""
        op = self.ops.get(func)
        if op is None:
            op = self.ops[func] = _Op(self.t, func)
        written = []
        for i in op.written:
            if i < len(args):
                written.append(args[i])
            elif op.arguments[i] in kwargs:
                written.append(kwargs[op.arguments[i]])
        for w in written:
            self.forget(w)
        if op.skip:
            return
        Tensor = self.t.Tensor
        if isinstance(out, Tensor):
            outs = [out]
        elif isinstance(out, (tuple, list)) and out and all(isinstance(o, Tensor) for o in out):
            outs = list(out)
        else:
            return
        if any(o.numel() > LIMIT for o in outs):
            return
        real = self._compute(func, op, list(args), dict(kwargs), out, written)
        if real is None:
            return
        reals = [real] if isinstance(real, Tensor) else list(real)
        if len(reals) != len(outs):
            return
        for o, r in zip(outs, reals, strict=True):
            if not isinstance(r, Tensor) or tuple(o.shape) != tuple(r.shape) or o.dtype != r.dtype:
                return
        for o, r in zip(outs, reals, strict=True):
            self._set(o, r)

    def _compute(
        self, func: Any, op: _Op, args: list[Any], kwargs: dict[str, Any], out: Any, written: list
    ) -> Any:
        """``func`` computed for real on the known values of its inputs, on the CPU (None:
        an input is not known and none absorbs)."""
        t = self.t
        Tensor = t.Tensor
        slots: list[tuple[Any, ...]] = []  # ("a", i), ("a", i, j) in a list, ("k", name)
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                slots.append(("a", i))
            elif isinstance(a, (list, tuple)):
                slots.extend(("a", i, j) for j, x in enumerate(a) if isinstance(x, Tensor))
        for k, a in kwargs.items():
            if isinstance(a, Tensor):
                slots.append(("k", k))
            elif isinstance(a, (list, tuple)) and any(isinstance(x, Tensor) for x in a):
                return None
        template = None
        if slots and slots[0] == ("a", 0) and (op.name in _LIKE or op.name in _OVERWRITES):
            template = args[0]  # its values don't matter: only its shape and dtype
            slots = slots[1:]
        if not slots and template is None and op.name not in _FACTORIES:
            return None
        values = []
        for s in slots:
            if s[0] == "k":
                x = kwargs[s[1]]
            elif len(s) == 2:
                x = args[s[1]]
            else:
                x = args[s[1]][s[2]]
            values.append(self.value(x))
        if any(v is None for v in values):
            return self._absorbed(op, args, values, out)
        written_ids = {id(w) for w in written}
        with self.no_dispatch():
            if template is not None:
                args[0] = t.zeros(tuple(template.shape), dtype=template.dtype, device="cpu")
            for s, v in zip(slots, values, strict=True):
                if s[0] == "k":  # a written input gets a private copy; others are read only
                    kwargs[s[1]] = v.clone() if id(kwargs[s[1]]) in written_ids else v
                elif len(s) == 2:
                    args[s[1]] = v.clone() if id(args[s[1]]) in written_ids else v
                else:
                    seq = list(args[s[1]])
                    seq[s[2]] = v
                    args[s[1]] = seq
        cpu = t.device("cpu")
        args = [cpu if isinstance(a, t.device) else a for a in args]
        if "device" in kwargs:
            kwargs["device"] = cpu
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        try:
            with self.no_dispatch(), t.no_grad():
                r = func(*args, **kwargs)
        except Exception:
            return None
        self.computed += 1
        return r

    def _absorbed(self, op: _Op, args: list[Any], values: list[Any], out: Any) -> Any:
        """``x & 0``, ``x * 0`` (integers), ``x | True``: known whatever ``x`` is."""
        name, t = op.name, self.t
        if not isinstance(out, t.Tensor):
            return None
        dtype = out.dtype
        if name in _ZERO_ABSORBS:
            if dtype.is_floating_point or dtype.is_complex:
                return None  # nan * 0 is nan
            absorbing = False
        elif name in _TRUE_ABSORBS and dtype == t.bool:
            absorbing = True
        else:
            return None
        with self.no_dispatch():
            known = [v for v in values if v is not None]
            known += [t.tensor(a, device="cpu") for a in args[:2] if isinstance(a, (bool, int))]
            for v in known:
                if v.numel() and bool(v.all() if absorbing else not v.any()):
                    make = t.ones if absorbing else t.zeros
                    return make(tuple(out.shape), dtype=dtype, device="cpu")
        return None
