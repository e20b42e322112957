"""Hugging Face ``model.generate()`` (greedy, KV cache) under the dry run: does it end,
how long per new token, where the time goes, and what it predicts.

    python benchmarks/probes/probe_generate.py                      # both fixes off/on, tiny + gpt2
    python benchmarks/probes/probe_generate.py --config gpt2 --tokens 64 --fix values
    python benchmarks/probes/probe_generate.py --config gpt2 --tokens 8 --profile

The model is built from ``transformers.GPT2Config`` (no weights are downloaded): ``tiny``
(2 layers, 64 wide), ``gpt2`` (124M: 12 layers, 768 wide, 12 heads). It is built inside
the recorded function under ``with torch.device(DEVICE)`` (``--build inside``, the
default) or outside it as real CPU tensors (``--build outside``). ``DEVICE`` is the dry
run's device type: ``cpu`` (a CPU build of torch models the CPU's storages as one GPU's)
or ``cuda``.

``--fix``:

- ``none``: the dry run as it is. ``generate()``'s loop ends on
  ``bool(unfinished_sequences.max() == 0)`` (``StopCheck``), which the dry run answers
  False for ever: the loop never ends. The probe's own watchdog stops it (after
  ``--watchdog`` seconds or 4 x max_new_tokens forward passes) and says so.
- ``values``: the prototype of the fix, monkeypatched: small tensors whose values come from
  constants are known (``KnownValues`` below, the proposed ``collectors/dry_run/values.py``),
  so the read is answered from ``torch.full((batch,), True)`` of ``MaxLengthCriteria`` and
  the loop ends at ``max_new_tokens``; plus a time budget (``--budget``).

For each run, one block: forward passes (= tokens), seconds in all and per new token,
ops dispatched, host reads (answered from known values / answered 0), the dry run's notes
and error, the KV cache live at the last read (storages made by ``aten.cat`` in the
attention layers) against ``2 x layers x batch x heads x seq x head_dim x bytes``, and,
with ``--predict``, the dry run's predicted peaks (``core.dry_run.dry_run``).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import os
import pstats
import sys
import time
import types
import weakref
from collections import Counter
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("PROBE_SRC"):  # another copy of the package (a snapshot of HEAD)
    sys.path.insert(0, os.environ["PROBE_SRC"])
elif ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import transformers  # noqa: E402

from jupyter_gpumem.collectors.dry_run import run as fake_run  # noqa: E402
from jupyter_gpumem.collectors.dry_run import state as fake_state  # noqa: E402

transformers.logging.set_verbosity_error()
# the fix merged: collectors/dry_run/values.py exists and the recorder uses it
BUILT_IN = importlib.util.find_spec("jupyter_gpumem.collectors.dry_run.values") is not None

CONFIGS = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 1024},
    "gpt2": {},  # GPT2Config()'s defaults: 124M
}


# -- the prototype of the fix: known small values ------------------------------------------
LIMIT = 4096  # elements: a known tensor's largest size
# factories whose first argument's values do not matter (only its shape and dtype)
_LIKE = frozenset(
    {"zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "fill"}
)
# ops that overwrite their first argument whatever it held
_OVERWRITES = frozenset({"copy_", "fill_", "zero_"})
# factories without tensor inputs whose values their arguments determine
_FACTORIES = frozenset({"full", "ones", "zeros", "arange", "scalar_tensor", "linspace", "eye"})
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


class _Info:
    """What the values need to know about an op, once per op."""

    __slots__ = ("arguments", "inplace_view", "name", "skip", "written")

    def __init__(self, t: Any, func: Any) -> None:
        self.name = getattr(func, "_opname", str(func))
        schema = getattr(func, "_schema", None)
        tags = getattr(func, "tags", ())
        self.inplace_view = t.Tag.inplace_view in tags
        self.skip = (
            getattr(func, "namespace", "") not in ("aten", "prims")
            or t.Tag.nondeterministic_seeded in tags
            or self.name in _NEVER
        )
        arguments = schema.arguments if schema is not None else []
        self.arguments = [a.name for a in arguments]
        self.written = [
            i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
        ]


class KnownValues:
    """Small values a dry run knows, beside their fake tensors (see the module's
    docstring of the proposed ``collectors/dry_run/values.py`` in the report)."""

    def __init__(self, t: Any, fake_type: type) -> None:
        from torch.utils._mode_utils import no_dispatch

        self.t = t
        self.fake_type = fake_type
        self.no_dispatch = no_dispatch
        self.known: dict[int, tuple[Any, Any, int]] = {}  # id(x) -> (weakref, value, id(st))
        self.by_storage: dict[int, set[int]] = {}
        self.infos: dict[Any, _Info] = {}
        self.computed = 0  # ops computed for real on known values
        self.answered = 0  # host reads answered with a known value

    def value(self, x: Any) -> Any:
        """``x``'s values (a CPU tensor, read only), or None when not known."""
        entry = self.known.get(id(x))
        if entry is not None and entry[0]() is x:
            return entry[1]
        if isinstance(x, self.fake_type):
            c = getattr(x, "constant", None)  # torch's own constants (torch.tensor(3))
            if c is not None and c.device.type == "cpu" and c.numel() <= LIMIT:
                return c
            return None
        if isinstance(x, self.t.Tensor) and x.device.type == "cpu" and not x.requires_grad:
            try:  # a real CPU tensor of the user's, small: its own values
                return x if x.layout == self.t.strided and x.numel() <= LIMIT else None
            except Exception:
                return None
        return None

    def _set(self, x: Any, v: Any) -> None:
        try:
            sid = id(x.untyped_storage())
        except Exception:
            return
        key = id(x)
        self._drop(key)
        ref = weakref.ref(x, lambda r, key=key: self._dead(key, r))
        self.known[key] = (ref, v, sid)
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

    def _forget_storage(self, x: Any) -> None:
        if isinstance(x, (list, tuple)):
            for y in x:
                self._forget_storage(y)
            return
        if not isinstance(x, self.t.Tensor):
            return
        try:
            sid = id(x.untyped_storage())
        except Exception:
            return
        for key in list(self.by_storage.get(sid, ())):
            self._drop(key)

    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """What ``func`` (run on the fake tensors, giving ``out``) makes known; what it
        wrote is forgotten first."""
        info = self.infos.get(func)
        if info is None:
            info = self.infos[func] = _Info(self.t, func)
        written = []
        for i in info.written:
            if i < len(args):
                written.append(args[i])
            elif info.arguments[i] in kwargs:
                written.append(kwargs[info.arguments[i]])
        for w in written:
            self._forget_storage(w)
        if info.skip or info.inplace_view:
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
        real = self._compute(func, info, list(args), dict(kwargs), out, written)
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
        self, func: Any, info: _Info, args: list, kwargs: dict, out: Any, written: list
    ) -> Any:
        t = self.t
        Tensor = t.Tensor
        slots: list[tuple[Any, ...]] = []  # ("a", i) | ("a", i, j) in a list | ("k", name)
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
        if slots and slots[0] == ("a", 0) and (info.name in _LIKE or info.name in _OVERWRITES):
            template = args[0]  # its values don't matter: only its shape and dtype
            slots = slots[1:]
        if not slots and template is None and info.name not in _FACTORIES:
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
            return self._absorbed(info, args, values, out)
        written_ids = {id(w) for w in written}
        with self.no_dispatch():
            if template is not None:
                args[0] = t.zeros(tuple(template.shape), dtype=template.dtype, device="cpu")
            for s, v in zip(slots, values, strict=True):
                if s[0] == "k":
                    kwargs[s[1]] = v.clone() if id(kwargs[s[1]]) in written_ids else v
                elif len(s) == 2:
                    args[s[1]] = v.clone() if id(args[s[1]]) in written_ids else v
                else:
                    seq = list(args[s[1]])
                    seq[s[2]] = v
                    args[s[1]] = seq
        for i, a in enumerate(args):
            if isinstance(a, t.device):
                args[i] = t.device("cpu")
        if "device" in kwargs:
            kwargs["device"] = t.device("cpu")
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        try:
            with self.no_dispatch(), t.no_grad():
                r = func(*args, **kwargs)
        except Exception:
            return None
        self.computed += 1
        return r

    def _absorbed(self, info: _Info, args: list[Any], values: list[Any], out: Any) -> Any:
        """``x & 0``, ``x * 0`` (integers), ``x | True``: known whatever ``x`` is."""
        name, t = info.name, self.t
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


class TimeBudget(BaseException):
    """The prototype's time budget: a dry run that runs longer stops, with a line."""


def install_fix(budget: float) -> Any:
    """Monkeypatch the recorder (``fake_state``) with the prototype: known values after
    each op, host reads answered from them, and a time budget. Returns an undo."""
    Recorder = fake_state.recorder_class()
    orig_dispatch = Recorder.__torch_dispatch__
    orig_host_read = fake_state.State.host_read

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        state = self.state
        values = state.__dict__.get("values")
        if values is None:
            values = state.values = KnownValues(state.t, state.fake_type)
            state.deadline = time.perf_counter() + budget
        if not state.ops & 255 and time.perf_counter() > state.deadline:
            raise TimeBudget(
                f"the dry run ran past its {budget:g} s budget ({state.ops:,} ops, "
                f"{state.reads:,} values read): stopped"
            )
        out = orig_dispatch(self, func, types, args, kwargs)
        if out is not NotImplemented and func is not state.scalar_read:
            values.after(func, args, kwargs or {}, out)
        return out

    def host_read(self: Any, x: Any) -> Any:
        values = self.__dict__.get("values")
        v = values.value(x) if values is not None else None
        if v is None:
            return orig_host_read(self, x)
        self.reads += 1  # known or not, a read counts: `while not done` loops on known too
        if self.reads > fake_state.MAX_HOST_READS:
            raise RuntimeError(
                f"the run read {fake_state.MAX_HOST_READS:,} values to the host: a loop that "
                "waits on a value never ends in a dry run"
            )
        values.answered += 1
        with values.no_dispatch():
            return v.item()

    Recorder.__torch_dispatch__ = dispatch
    fake_state.State.host_read = host_read

    def undo() -> None:
        Recorder.__torch_dispatch__ = orig_dispatch
        fake_state.State.host_read = orig_host_read

    return undo


# -- the probe --------------------------------------------------------------------------------
class Watchdog(BaseException):
    pass


class Probe:
    """Watches one dry run: the state (ops, reads), forward passes and their times, and the
    KV cache at the last host read."""

    def __init__(self, max_forwards: int, watchdog: float) -> None:
        self.max_forwards = max_forwards
        self.watchdog = watchdog
        self.state: Any = None
        self.forwards: list[float] = []
        self.read_where: Counter[str] = Counter()
        self.kv: tuple[int, int, int] = (0, 0, 0)  # (tensors, bytes, bytes recorded live)
        self.start = 0.0

    def install(self) -> Any:
        orig_init = fake_state.State.__init__
        orig_read = fake_state.State.host_read
        probe = self

        def init(self: Any, *a: Any, **k: Any) -> None:
            orig_init(self, *a, **k)
            probe.state = self

        def read(self: Any, x: Any) -> Any:
            f = sys._getframe(1)
            for _ in range(12):  # the first frame in transformers
                if f is None or "transformers" in f.f_code.co_filename:
                    break
                f = f.f_back
            if f is not None:
                name = f.f_code.co_filename.split("transformers/")[-1]
                probe.read_where[f"{name}:{f.f_lineno} {f.f_code.co_name}"] += 1
            return orig_read(self, x)

        fake_state.State.__init__ = init
        fake_state.State.host_read = read

        def undo() -> None:
            fake_state.State.__init__ = orig_init
            fake_state.State.host_read = orig_read

        return undo

    def hook(self, module: Any, args: Any) -> None:
        self.forwards.append(time.perf_counter())
        n = len(self.forwards)
        if n > self.max_forwards or time.perf_counter() - self.start > self.watchdog:
            raise Watchdog(
                f"probe's watchdog: {n - 1} forward passes in "
                f"{time.perf_counter() - self.start:.1f} s, generate() has not ended"
            )

    def after_forward(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        """The KV cache after this forward pass: its tensors, their bytes, and the bytes of
        those the dry run recorded as live allocations."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None:
            cache = getattr(output, "past_key_values", None)
        layers = getattr(cache, "layers", None)
        if not layers:
            return
        live = self.state.live
        n = total = recorded = 0
        for layer in layers:
            for x in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if x is None or not isinstance(x, torch.Tensor):
                    continue
                st = x.untyped_storage()
                n += 1
                total += st.nbytes()
                entry = live.get(id(st))
                if entry is not None and entry[0] is not None:
                    recorded += entry[1]
        self.kv = (n, total, recorded)


def run_one(args: argparse.Namespace, n_new: int, fix: str) -> dict[str, Any]:
    cfg = transformers.GPT2Config(**CONFIGS[args.config])
    device = args.device
    torch.manual_seed(0)
    outside: dict[str, Any] = {}
    if args.build == "outside":  # real tensors, on the device for a CUDA run
        outside["model"] = transformers.GPT2LMHeadModel(cfg).eval().to(device)
        outside["ids"] = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device=device)
    probe = Probe(max_forwards=4 * n_new + 4, watchdog=args.watchdog)
    result: dict[str, Any] = {}
    # what run() reaches goes through a module object: a dry run puts back what the run
    # changed in the objects its function reaches (closure, globals), and leaves modules be
    box = types.ModuleType("probe_generate_box")
    box.probe, box.result, box.outside, box.cfg, box.args, box.n_new = (
        probe,
        result,
        outside,
        cfg,
        args,
        n_new,
    )

    def run() -> None:
        a, c = box.args, box.cfg
        if a.build == "inside":
            with torch.device(a.device):
                model = transformers.GPT2LMHeadModel(c).eval()
                ids = torch.randint(0, c.vocab_size, (a.batch, a.prompt))
        else:
            model, ids = box.outside["model"], box.outside["ids"]
        handles = [
            model.register_forward_pre_hook(box.probe.hook),
            model.register_forward_hook(box.probe.after_forward, with_kwargs=True),
        ]
        try:
            box.probe.start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=box.n_new, do_sample=False)
            box.result["out_shape"] = tuple(out.shape)
        finally:
            for h in handles:
                h.remove()

    if BUILT_IN:  # the recorder has it: no monkeypatch, and "none" is not possible
        fix = "built in"
        undo_fix: Any = lambda: None  # noqa: E731
    else:
        undo_fix = install_fix(args.budget) if fix == "values" else (lambda: None)
    undo_probe = probe.install()  # outermost: sees every read
    profiler = cProfile.Profile() if args.profile else None
    try:
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        if args.predict:
            from jupyter_gpumem.core.dry_run import dry_run

            dry = dry_run(run, device_type=device)
            seen = None
        else:
            seen = fake_run.record(run, device_type=device)
            dry = None
        if profiler:
            profiler.disable()
        seconds = time.perf_counter() - t0
    finally:
        undo_probe()
        undo_fix()
    st = probe.state
    fw = probe.forwards
    per_token = (fw[-1] - fw[1]) / (len(fw) - 2) if len(fw) > 2 else None
    values = getattr(st, "values", None)
    result.update(
        fix=fix,
        config=args.config,
        build=args.build,
        batch=args.batch,
        prompt=args.prompt,
        max_new_tokens=n_new,
        forwards=len(fw),
        seconds=round(seconds, 2),
        prefill_s=round(fw[1] - fw[0], 3) if len(fw) > 1 else None,
        s_per_token=round(per_token, 4) if per_token else None,
        ops=st.ops if st else None,
        host_reads=st.reads if st else None,
        answered_known=getattr(values, "answered", 0),
        computed_known=getattr(values, "computed", 0),
        read_where=dict(probe.read_where.most_common(6)),
    )
    if seen is not None:
        result["error"] = seen.error.line if seen.error else None
        result["notes"] = list(seen.notes)
    if dry is not None:
        result["error"] = dry.stopped
        result["notes"] = list(dry.notes)
        d = dry.devices[0] if dry.devices else None
        result["peak_allocated"] = d.peak_allocated if d else None
        result["peak_reserved"] = d.peak_reserved if d else None
    # the KV cache after the last forward pass, against arithmetic
    head_dim = cfg.n_embd // cfg.n_head
    seq = args.prompt + len(fw) - 1  # each forward pass adds its tokens; prefill: prompt
    expect = 2 * cfg.n_layer * args.batch * cfg.n_head * seq * head_dim * 4
    result["kv_tensors"], result["kv_bytes"], result["kv_recorded_live"] = probe.kv
    result["kv_arithmetic"] = (
        f"2 x {cfg.n_layer} layers x {args.batch} x {cfg.n_head} heads x {seq} tokens x "
        f"{head_dim} x 4 B = {expect:,}"
    )
    if args.real and device == "cuda":
        result.update(real_run(args, cfg, n_new, outside))
    if profiler:
        s = io.StringIO()
        pstats.Stats(profiler, stream=s).sort_stats("tottime").print_stats(args.profile)
        result["profile_tottime"] = s.getvalue()
        s = io.StringIO()
        pstats.Stats(profiler, stream=s).sort_stats("cumulative").print_stats(args.profile * 2)
        result["profile_cumulative"] = s.getvalue()
    return result


def real_run(args: argparse.Namespace, cfg: Any, n_new: int, outside: dict) -> dict[str, Any]:
    """The same generate() for real on the GPU: its peak above the start (the dry run's
    prediction counts the weights when the model is built inside, not when outside)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    with torch.no_grad():
        if args.build == "inside":
            with torch.device("cuda"):
                model = transformers.GPT2LMHeadModel(cfg).eval()
                ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt))
        else:
            model, ids = outside["model"], outside["ids"]
        out = model.generate(ids, max_new_tokens=n_new, do_sample=False)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base
    reserved = torch.cuda.max_memory_reserved()
    shape = tuple(out.shape)
    del model, ids, out
    return {
        "real_out_shape": shape,
        "real_seconds": round(seconds, 2),
        "real_peak_allocated_above_start": peak,
        "real_peak_reserved": reserved,
    }


def show(r: dict[str, Any]) -> None:
    prof = {k: r.pop(k) for k in ("profile_tottime", "profile_cumulative") if k in r}
    notes = r.pop("notes", [])
    print("-" * 78)
    for k, v in r.items():
        print(f"  {k}: {v}")
    for n in notes[:8]:
        print(f"  note: {n[:200]}")
    for k, v in prof.items():
        print(f"  == {k}\n{v}")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=sorted(CONFIGS), action="append")
    p.add_argument("--tokens", type=int, action="append", help="max_new_tokens (repeatable)")
    p.add_argument("--fix", choices=("none", "values"), action="append")
    p.add_argument("--build", choices=("inside", "outside"), default="inside")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--watchdog", type=float, default=30.0, help="seconds, per run")
    p.add_argument("--budget", type=float, default=120.0, help="the fix's time budget, s")
    p.add_argument("--predict", action="store_true", help="through core.dry_run (peaks)")
    p.add_argument("--profile", type=int, default=0, help="cProfile: show this many rows")
    p.add_argument("--real", action="store_true", help="also run it for real (CUDA)")
    args = p.parse_args()
    configs = args.config or ["tiny", "gpt2"]
    fixes = args.fix or (["values"] if BUILT_IN else ["none", "values"])
    tokens = args.tokens or [1, 8]
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"fix built in: {BUILT_IN}, {os.cpu_count()} CPUs"
    )
    for config in configs:
        args.config = config
        for fix in fixes:
            for n in tokens:
                show(run_one(args, n, fix))


if __name__ == "__main__":
    main()
