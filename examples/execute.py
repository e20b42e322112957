"""Run example notebooks in place on a GPU machine, so that they open with their outputs.

    python3 examples/execute.py examples/demo.ipynb examples/quickstart.ipynb

Cells tagged ``raises-exception`` may raise; any other error stops with the cell's
traceback. Where and with what the outputs were made goes into the notebook's metadata
(``jupyter_gpumem.outputs``).
"""

from __future__ import annotations

import datetime
import sys

import nbformat
from nbclient import NotebookClient


def machine() -> dict[str, str]:
    import torch

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }


def main(paths: list[str]) -> None:
    where = machine()
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=900, kernel_name="python3").execute()
        nb.metadata["jupyter_gpumem"] = {"outputs": where}
        nbformat.write(nb, path)
        print(f"{path}: outputs from {where['gpu']} (torch {where['torch']})")


if __name__ == "__main__":
    main(sys.argv[1:])
