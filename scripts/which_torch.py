"""Say which torch the environment that runs this uses (the main job's .venv): the one of
the Python that made it, or none. Finds it without importing it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys


def no_torch(base: str, managed: bool) -> str:
    """What to do without torch: install it into the Python that made .venv (which .venv
    sees), or, where the system manages that Python (PEP 668) and its pip refuses, into
    .venv itself."""
    if managed:
        return (
            "torch: none in this environment. The demo needs none (make demo). The Python "
            f"that made .venv ({base}) is the system's (externally managed, PEP 668), so pip "
            "will not install into it: for your own notebooks, install torch into .venv "
            "itself, as PyTorch's instructions say for your CUDA version "
            "(.venv/bin/python -m pip install ...), then rerun make lab."
        )
    return (
        "torch: none in this environment. The demo needs none (make demo); for your own "
        f"notebooks, install torch into the Python that made .venv ({base}), as PyTorch's "
        "instructions say for your CUDA version, then rerun make lab."
    )


def main() -> None:
    spec = importlib.util.find_spec("torch")
    if spec is None:
        from jupyter_gpumem.collectors.torch_build import externally_managed

        # .venv is a virtual environment; the question is whether pip refuses the Python
        # that made it (its standard library is the one this one uses)
        print(no_torch(sys.base_prefix, externally_managed(in_venv=False)))
    else:
        version = importlib.metadata.version("torch")
        where = spec.origin.rsplit("/torch/", 1)[0] if spec.origin else "?"
        print(f"torch: {version} from {where} (yours; never replaced by this install)")


if __name__ == "__main__":
    main()
