"""Libraries that keep references of their own, and their own ways to let go of them
(``%gpumem free``). Nothing here imports a library: an object is recognised by its type's
module, from the libraries the user imported.

- accelerate: an ``Accelerator`` keeps every model, optimizer and scheduler it prepared in
  ``_models``, ``_optimizers``, ``_schedulers``; only the named object's entries are taken
  out (``accelerator.free_memory()`` would drop the others too).
- vLLM: an ``LLM`` engine holds its model in executor workers (in this process or in an
  engine-core process) and module-level distributed state; the teardown is the one vLLM
  documents: shut the engine core down, delete the model executor, then
  ``destroy_model_parallel()`` and ``destroy_distributed_environment()``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .namespace import Root

ACCELERATE_LISTS = ("_models", "_optimizers", "_schedulers")


@dataclass
class LibraryHold:
    """One reference a library keeps, and how to drop it."""

    label: str  # "accelerator._models[0]"
    obj: Any  # what it holds (walked to know what it reaches)
    why: str
    code: str
    remove: Callable[[], None] = field(repr=False)


def _module_of(obj: Any) -> str:
    return type(obj).__module__ or ""


def is_accelerator(obj: Any) -> bool:
    return (
        "accelerate" in sys.modules
        and type(obj).__name__ == "Accelerator"
        and (_module_of(obj).startswith("accelerate"))
    )


def is_vllm_engine(obj: Any) -> bool:
    return (
        "vllm" in sys.modules
        and type(obj).__name__ in ("LLM", "AsyncLLMEngine")
        and (_module_of(obj).startswith("vllm"))
    )


def prepared(acc: Any, label: str) -> list[LibraryHold]:
    """An Accelerator's prepared objects, each removable from its list alone."""
    out: list[LibraryHold] = []
    for attr in ACCELERATE_LISTS:
        items = getattr(acc, attr, None)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):

            def remove(items: list = items, item: Any = item) -> None:
                for j in range(len(items) - 1, -1, -1):
                    if items[j] is item:
                        del items[j]

            out.append(
                LibraryHold(
                    f"{label}.{attr}[{i}]",
                    item,
                    "accelerate: an Accelerator keeps every object it prepared",
                    f"{label}.{attr}.remove(...)",
                    remove,
                )
            )
    return out


def shared_by_accelerate(acc: Any) -> set[int]:
    """ids of the lists :func:`prepared` covers (a walk of the Accelerator skips them)."""
    return {
        id(getattr(acc, a)) for a in ACCELERATE_LISTS if isinstance(getattr(acc, a, None), list)
    }


def vllm_state_roots() -> list[Root]:
    """Roots for what vLLM keeps at module level (``vllm.distributed.parallel_state``'s
    groups and their buffers): its teardown lets go of them."""
    state = sys.modules.get("vllm.distributed.parallel_state")
    if state is None:
        return []
    name = state.__name__
    return [
        Root(f"{name}.{k}", v, path=f"{name}.{k}")
        for k, v in vars(state).items()
        if not k.startswith("__")
        and not isinstance(v, (types.ModuleType, types.FunctionType, type))
    ]


def vllm_teardown(llm: Any, label: str) -> LibraryHold:
    """vLLM's documented teardown for ``llm``."""

    def remove() -> None:
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()
        executor = getattr(engine, "model_executor", None)
        if engine is not None and executor is not None:
            stop = getattr(executor, "shutdown", None)
            if callable(stop):
                stop()
            try:
                del engine.model_executor
            except AttributeError:
                pass
        state = sys.modules.get("vllm.distributed.parallel_state")
        for fn in ("destroy_model_parallel", "destroy_distributed_environment"):
            f = getattr(state, fn, None)
            if callable(f):
                f()

    return LibraryHold(
        label,
        llm,
        "vLLM: its engine and distributed state are torn down as vLLM documents",
        "engine_core.shutdown(); del llm.llm_engine.model_executor; "
        "destroy_model_parallel(); destroy_distributed_environment()",
        remove,
    )


__all__ = [
    "LibraryHold",
    "is_accelerator",
    "is_vllm_engine",
    "prepared",
    "shared_by_accelerate",
    "vllm_state_roots",
    "vllm_teardown",
]
