"""What ``%gpumem free NAME`` lets go of, and what that should give back: a plan made from
plain records (what a walk from each holder alone reaches, the allocator's snapshot), so it
runs unchanged on recorded data.

The storages the named objects own are the *target* (an optimizer's parameters and what
an autograd graph saved are referenced, not owned: freeing the optimizer or the loss keeps
the model and the input). Every other holder that reaches part of it is
decided by what else it reaches:

- an output-history entry (``Out[7]``, ``_``, ``_7``) is forgotten, the kept traceback is
  released, a hook or a library's own list is removed as its front end says: none is data;
- a holder that reaches nothing but the target (another name for it, a name for one of its
  parameters) is deleted;
- a tensor that reaches the target only through its autograd graph (``total_loss``) keeps
  its value and drops its graph (``detach_()``);
- a holder whose other memory only comes with the target (an optimizer's state, gradients,
  autograd graphs: AdamW over the model) is deleted, as is an object of a library that
  builds on models (:data:`BUILT_ON`: a ``Trainer``, a ``pipeline``, a PEFT or DDP wrapper);
- any other holder (a dict that also holds other tensors) is left as it is, and named with
  the bytes it keeps and the line that would drop them.

What is expected back: the blocks that no remaining holder reaches, and, to the driver,
each segment whose live blocks are all among them, plus the segments the cache already held
free (``empty_cache`` returns those too).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..model import AllocatorSnapshot, Reference
from ..model.free import DeviceFree, FreeReport, Holder, LetGo, LetGoAction
from ..units import format_bytes

HolderKind = Literal["name", "output", "traceback", "hook", "library"]
Key = tuple[int, int]  # (device, address)

# What comes with the target when its holder goes: never data of the user's own.
DERIVED = frozenset({"optimizer state", "gradients", "autograd graph", "optimizer params"})
# Libraries whose objects are built on a model (a Trainer, a pipeline, a PEFT or DDP
# wrapper): one that holds the named model goes with it, whatever buffers it keeps.
BUILT_ON = frozenset(
    {
        "transformers",
        "accelerate",
        "peft",
        "trl",
        "diffusers",
        "sentence_transformers",
        "lightning",
        "pytorch_lightning",
        "deepspeed",
        "vllm",
        "torch.nn.parallel",
        "torch.distributed.fsdp",
    }
)
# How a walk names the kept traceback's places (``traceback: f() at In[3] line 2: x``), and
# the one place a plan lets go of for all of them.
TRACEBACK_PREFIX = "traceback:"
TRACEBACK = "the kept traceback"
_OUTPUT = re.compile(r"^(?:Out\[\d+\]|_\d+|_{1,3})$")


@dataclass(frozen=True, slots=True)
class HolderWalk:
    """One holder and what a walk from it alone reaches."""

    owner: str  # "model", "Out[7]", "_", "the kept traceback", "other._forward_hooks[3]"
    kind: HolderKind
    refs: tuple[Reference, ...]
    type_name: str = ""  # "AdamW", "Trainer", "Tensor"
    is_tensor: bool = False
    same_as: str = ""  # the named object this holder is (another name for it)
    code: str = ""  # for hooks and libraries: the Python that lets it go
    why: str = ""  # for hooks and libraries: what it is, in words
    library: str = ""  # the module its type comes from ("transformers.trainer")
    goes_with: str = ""  # a library's state that the named object's teardown lets go of


def plan(
    names: Sequence[str],
    holders: Sequence[HolderWalk],
    snapshot: AllocatorSnapshot | None = None,
    notes: Iterable[str] = (),
) -> tuple[FreeReport, set[Key]]:
    """The plan for freeing ``names`` (each the ``owner`` of one of ``holders``), and the
    blocks (device, address) it expects to be freed."""
    by_owner = {h.owner: h for h in holders}
    targets = [by_owner[n] for n in names]
    target_of: dict[Key, str] = {}
    for h in targets:
        for r in h.refs:
            if not _borrowed(r):
                target_of.setdefault((r.device, r.address), h.owner)
    target = set(target_of)  # what the named objects own (not what they only reference)
    sizes = _sizes(holders, snapshot)

    def nbytes(keys: Iterable[Key]) -> int:
        return sum(sizes.get(k, 0) for k in keys)

    let_go = [
        LetGo(h.owner, _own_action(h), "the name you gave", nbytes(_keys(h) & target), _own_code(h))
        for h in targets
    ]
    dropped: set[Key] = set().union(*(_keys(h) for h in targets))
    remaining: set[Key] = set()
    kept: list[Holder] = []
    for h in holders:
        if h.owner in names:
            continue
        keys = _keys(h)
        if h.goes_with:  # torn down with the named object, whether or not it reaches it
            let_go.append(LetGo(h.owner, "teardown", h.why, nbytes(keys), h.code))
            dropped |= keys
            continue
        overlap = keys & target
        if not overlap:
            remaining |= keys
            continue
        first = target_of[max(overlap, key=lambda k: sizes.get(k, 0))]
        decided = _decide(h, keys, overlap, target, first)
        if decided is None:
            remaining |= keys
            example = _example(h, overlap)
            other = keys - target
            kept.append(
                Holder(
                    h.owner,
                    nbytes(overlap),
                    example,
                    f"also holds {format_bytes(nbytes(other))} of other GPU memory "
                    f"(e.g. {_example(h, other)}): left as it is",
                    f"del {_first_step(example)}",
                )
            )
            continue
        action, why, code = decided
        let_go.append(LetGo(h.owner, action, why, nbytes(overlap), code))
        if action == "detach":
            own = {(r.device, r.address) for r in h.refs if r.via != "autograd graph"}
            remaining |= own
            dropped |= keys - own
        else:
            dropped |= keys
    freed = dropped - remaining
    devices = sorted({k[0] for k in target if k in sizes})
    out = []
    for d in devices:
        held = nbytes(k for k in target if k[0] == d)
        freed_d = {a for dev, a in freed if dev == d}
        expected, cached = _returned(snapshot, d, freed_d, sizes)
        out.append(DeviceFree(d, held, nbytes((d, a) for a in freed_d), expected, cached))
    report = FreeReport(tuple(names), tuple(let_go), tuple(kept), tuple(out), notes=tuple(notes))
    return report, {k for k in freed if k in sizes}


def unknown_name(name: str, known: Iterable[str]) -> str:
    """The sentence that refuses a name that is no variable (with the closest ones)."""
    close = difflib.get_close_matches(name, list(known), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"{name!r} is not a variable of this kernel{hint}: name a variable, Out[N] or _"


def nothing_to_free(names: Sequence[str]) -> str:
    """The sentence that refuses names that hold no GPU memory of the allocator."""
    what = ", ".join(names)
    return f"{what} hold(s) no GPU memory of this process's allocator: nothing to free"


def holder_kind(owner: str) -> HolderKind:
    """A place's kind from how a walk spells its owner (recorded references carry no
    other): ``Out[7]``, ``_7``, ``_`` are output history, ``traceback: ...`` the kept
    traceback, anything else a name."""
    if owner.startswith(TRACEBACK_PREFIX) or owner == TRACEBACK:
        return "traceback"
    return "output" if _OUTPUT.match(owner) else "name"


def walks_from_references(refs: Iterable[Reference]) -> list[HolderWalk]:
    """One :class:`HolderWalk` per owner of a walk's references (recorded ones: a walk of
    every place at once), in the order met; the kept traceback's frames are one place."""
    grouped: dict[str, list[Reference]] = {}
    for r in refs:
        owner = TRACEBACK if holder_kind(r.owner) == "traceback" else r.owner
        grouped.setdefault(owner, []).append(r)
    return [
        HolderWalk(
            owner,
            holder_kind(owner),
            tuple(rs),
            is_tensor=any(r.via == "tensor" and r.path == owner for r in rs),
        )
        for owner, rs in grouped.items()
    ]


def _decide(
    h: HolderWalk, keys: set[Key], overlap: set[Key], target: set[Key], first: str
) -> tuple[LetGoAction, str, str] | None:
    if h.kind == "output":
        return "forget", f"output history: it shows {first}", _forget_code(h.owner)
    if h.kind == "traceback":
        return "release", "the last error's frames hold it", "%gpumem release-traceback"
    if h.kind in ("hook", "library"):
        return ("unhook" if h.kind == "hook" else "teardown"), h.why, h.code
    if keys <= target:
        why = h.why or (f"another name for {h.same_as}" if h.same_as else f"a part of {first}")
        return "delete", why, f"del {h.owner}"
    vias = {(r.device, r.address): r.via for r in h.refs}
    if h.is_tensor and all(vias.get(k) == "autograd graph" for k in overlap):
        return (
            "detach",
            f"a tensor whose autograd graph reaches {first}: it keeps its value",
            f"{h.owner}.detach_()",
        )
    other = keys - target
    if all(_via_of(h, k) in DERIVED for k in other):
        if any(r.via == "optimizer params" for r in h.refs if (r.device, r.address) in overlap):
            why = f"the optimizer of {first}: its state goes with it"
        else:
            kind = f"a {h.type_name}" if h.type_name else "an object"
            why = (
                f"{kind} that holds {first} and, beyond it, only what comes with it "
                "(optimizer state, gradients, autograd graphs)"
            )
        return "delete", why, f"del {h.owner}"
    if _built_on(h.library):
        return (
            "delete",
            f"a {h.type_name or 'library object'} built on {first}: it goes with it",
            f"del {h.owner}",
        )
    return None


def _borrowed(r: Reference) -> bool:
    """A storage the holder only references, owned by others: an optimizer's parameters
    and their gradients, what an autograd graph saved or accumulates into (freeing the
    optimizer or the loss does not free the model or the input)."""
    if r.via in ("optimizer params", "autograd graph"):
        return True
    return r.via == "gradients" and (".param_groups[" in r.path or "].param." in r.path)


def _built_on(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in BUILT_ON)


def _via_of(h: HolderWalk, key: Key) -> str:
    """The strongest way ``h`` reaches ``key`` (data over derived state)."""
    vias = [r.via for r in h.refs if (r.device, r.address) == key]
    for v in vias:
        if v not in DERIVED:
            return v
    return vias[0] if vias else ""


def _keys(h: HolderWalk) -> set[Key]:
    return {(r.device, r.address) for r in h.refs}


def _own_action(h: HolderWalk) -> LetGoAction:
    return "forget" if h.kind == "output" else "delete"


def _own_code(h: HolderWalk) -> str:
    return _forget_code(h.owner) if h.kind == "output" else f"del {h.owner}"


def _forget_code(owner: str) -> str:
    m = re.fullmatch(r"Out\[(\d+)\]", owner)
    if m:
        return f"Out.pop({m.group(1)})"
    return f"{owner} = None"


def _example(h: HolderWalk, keys: set[Key]) -> str:
    best = max((r for r in h.refs if (r.device, r.address) in keys), key=lambda r: r.nbytes)
    return best.path


_STEP = re.compile(r"^([^.\[]+)(\[[^\]]*\]|\.[A-Za-z_]\w*)?")


def _first_step(path: str) -> str:
    """``results['model'].fc.weight`` -> ``results['model']``: what drops it from there."""
    m = _STEP.match(path)
    return m.group(0) if m else path


def _sizes(holders: Sequence[HolderWalk], snapshot: AllocatorSnapshot | None) -> dict[Key, int]:
    """Each storage's bytes: its allocator block's size when the snapshot has it, else the
    storage's own size."""
    sizes: dict[Key, int] = {}
    for h in holders:
        for r in h.refs:
            sizes[(r.device, r.address)] = r.nbytes
    if snapshot is not None:
        for d in {k[0] for k in sizes}:
            live = snapshot.live_blocks(d)
            for k in [k for k in sizes if k[0] == d]:
                b = live.get(k[1])
                if b is not None:
                    sizes[k] = b["size"]
                else:
                    del sizes[k]  # not the allocator's memory: nothing to give back here
    return sizes


def _returned(
    snapshot: AllocatorSnapshot | None, device: int, freed: set[int], sizes: dict[Key, int]
) -> tuple[int, int]:
    """Bytes ``empty_cache`` should give back once ``freed`` are free, and of those the
    bytes already free in the cache."""
    if snapshot is None:
        return sum(sizes.get((device, a), 0) for a in freed), 0
    back = cached = 0
    for s in snapshot.device_segments(device):
        active = [b for b in s.get("blocks", ()) if b["state"] != "inactive"]
        if not active:
            cached += s["total_size"]
            back += s["total_size"]
        elif all(b["state"] == "active_allocated" and b["address"] in freed for b in active):
            back += s["total_size"]
    return back, cached


__all__ = [
    "BUILT_ON",
    "DERIVED",
    "TRACEBACK",
    "HolderKind",
    "HolderWalk",
    "holder_kind",
    "nothing_to_free",
    "plan",
    "unknown_name",
    "walks_from_references",
]
