"""Say which torch the environment that runs this uses (the main job's .venv): the one of
the Python that made it, or none. Finds it without importing it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys

spec = importlib.util.find_spec("torch")
if spec is None:
    print(
        "torch: none in this environment. The demo needs none (make demo); for your own "
        "notebooks, install torch into the Python that made .venv, as PyTorch's instructions "
        f"say for your CUDA version ({sys.base_prefix}), then rerun make lab."
    )
else:
    version = importlib.metadata.version("torch")
    where = spec.origin.rsplit("/torch/", 1)[0] if spec.origin else "?"
    print(f"torch: {version} from {where} (yours; never replaced by this install)")
