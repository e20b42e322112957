"""Hugging Face ``model.generate()`` (greedy, KV cache) under the dry run: does it end,
how long per new token, where the time goes, and what it predicts.

    python benchmarks/probes/probe_generate.py                      # tiny and gpt2, 1 and 8 tokens
    python benchmarks/probes/probe_generate.py --config gpt2 --tokens 64
    python benchmarks/probes/probe_generate.py --config gpt2 --tokens 8 --profile

The model is built from ``transformers.GPT2Config`` (no weights are downloaded): ``tiny``
(2 layers, 64 wide), ``gpt2`` (124M: 12 layers, 768 wide, 12 heads). It is built inside
the recorded function under ``with torch.device(DEVICE)`` (``--build inside``, the
default) or outside it as real CPU tensors (``--build outside``). ``DEVICE`` is the dry
run's device type: ``cpu`` (a CPU build of torch models the CPU's storages as one GPU's)
or ``cuda``.

The loop ends on ``bool(unfinished_sequences.max() == 0)`` (``StopCheck``): the dry run
knows the values of small tensors made of constants (``collectors/dry_run/values.py``), so
it is answered from ``MaxLengthCriteria``'s ``torch.full((batch,), True)`` at the last
token. The probe's own watchdog stops a run that does not end (after ``--watchdog``
seconds or 4 x max_new_tokens forward passes) and says so.

For each run, one block: forward passes (= tokens), seconds in all and per new token,
ops dispatched, host reads (answered from known values / answered 0), the dry run's notes
and error, the KV cache live at the last read (storages made by ``aten.cat`` in the
attention layers) against ``2 x layers x batch x heads x seq x head_dim x bytes``, and,
with ``--predict``, the dry run's predicted peaks (``core.dry_run.dry_run``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import types
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

CONFIGS = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 1024},
    "gpt2": {},  # GPT2Config()'s defaults: 124M
}


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


def run_one(args: argparse.Namespace, n_new: int) -> dict[str, Any]:
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
    st = probe.state
    fw = probe.forwards
    per_token = (fw[-1] - fw[1]) / (len(fw) - 2) if len(fw) > 2 else None
    values = getattr(st, "values", None)
    result.update(
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
    p.add_argument("--build", choices=("inside", "outside"), default="inside")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--watchdog", type=float, default=30.0, help="seconds, per run")
    p.add_argument("--predict", action="store_true", help="through core.dry_run (peaks)")
    p.add_argument("--profile", type=int, default=0, help="cProfile: show this many rows")
    p.add_argument("--real", action="store_true", help="also run it for real (CUDA)")
    args = p.parse_args()
    configs = args.config or ["tiny", "gpt2"]
    tokens = args.tokens or [1, 8]
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {os.cpu_count()} CPUs"
    )
    for config in configs:
        args.config = config
        for n in tokens:
            show(run_one(args, n))


if __name__ == "__main__":
    main()
