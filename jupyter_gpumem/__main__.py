"""``python -m jupyter_gpumem run NOTEBOOK.ipynb``: the same as ``jupyter-gpumem run``."""

from __future__ import annotations

import sys

from .run.cli import main

if __name__ == "__main__":
    sys.exit(main())
