"""``jupyter-gpumem demo``: JupyterLab on a notebook recorded on an NVIDIA H200, played back.

For a machine without a GPU (a laptop, CI): the demo's kernel is started with a player
(``testing/player.py``, loaded by the kernel spec :func:`write_kernel_spec` writes) that
plays back a recording of the demo notebook made on a GPU (``testing/recorded/
demo_cells.json``). Running a recorded cell shows the outputs it gave there and moves the
panel, the status bar and the history through the readings recorded while it ran; every
output says that it is a replay. A cell the user edits or adds runs for real.

The demo notebook is copied into a folder of its own (a temporary one, removed when the
server stops, unless ``--dir`` names one), fresh from the recording each time: a copy that
was edited is moved aside (``demo-edited-1.ipynb``, ...), never overwritten, unless
``--keep`` opens it as it is. The copy is signed with Jupyter's notary, so that it opens
trusted and its recorded pictures are drawn, and the URL printed opens it directly.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import CliUsageError

NOTEBOOK = "demo.ipynb"
_HERE = Path(__file__).resolve().parent


def recording() -> Path:
    """The recording the demo's kernel plays (shipped inside the package)."""
    return _HERE / "testing" / "recorded" / "demo_cells.json"


def notebook_source() -> Path:
    """The demo notebook: inside an installed wheel, or ``examples/`` in a clone."""
    for path in (_HERE / "examples" / NOTEBOOK, _HERE.parent / "examples" / NOTEBOOK):
        if path.is_file():
            return path
    raise CliUsageError(f"the demo notebook {NOTEBOOK} is missing from this installation")


def recorded_on() -> str:
    """Where the recording was made, in words: "an NVIDIA H200 (torch 2.11.0+cu130)"."""
    import json

    with open(recording()) as f:
        meta = json.load(f).get("meta", {})
    gpu, torch = meta.get("device", "a GPU"), meta.get("torch")
    return f"an {gpu}" + (f" (torch {torch})" if torch else "")


PLAYER = "jupyter_gpumem.testing.player"  # the IPython extension that plays the recording


def kernel_env() -> dict[str, str]:
    """The variables that make a kernel play the recording (with the player loaded:
    :func:`write_kernel_spec`); the player's ``env()``."""
    return {
        "JUPYTER_GPUMEM_BACKEND": f"{PLAYER}:backend",
        "JUPYTER_GPUMEM_ATTRIBUTION": f"{PLAYER}:attribution",
        "JUPYTER_GPUMEM_DEMO_RECORDING": str(recording()),
    }


def write_kernel_spec(folder: Path) -> Path:
    """A ``python3`` kernel spec in ``folder/kernels/python3`` that loads the player: with
    ``folder`` first on ``JUPYTER_PATH`` the demo's server starts it for the notebook."""
    import json

    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {
        "argv": [*argv, f"--ext={PLAYER}"],
        "display_name": "Python 3 (replay of a GPU recording)",
        "language": "python",
        "env": kernel_env(),
        "metadata": {"debugger": False},
    }
    (spec / "kernel.json").write_text(json.dumps(kernel, indent=1))
    return spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="FOLDER",
        help="put the demo notebook here (created if missing); default: a temporary folder, "
        "removed when the server stops",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="open the demo notebook already in --dir as it is (with your edits); by "
        "default the recorded copy is opened and an edited one is moved aside",
    )
    parser.add_argument("--port", type=int, metavar="N", help="the server's port (default 8888)")
    parser.add_argument("--ip", metavar="ADDRESS", help="the address to listen on (localhost)")
    parser.add_argument(
        "--no-browser", action="store_true", help="print the URL instead of opening a browser"
    )
    parser.add_argument(
        "--print-env",
        action="store_true",
        help="only print the environment and the kernel option that make a kernel play the "
        "recording (for a server you start yourself) and exit",
    )


def prepare(folder: str | None, keep: bool = False) -> tuple[Path, str | None]:
    """The folder with the recorded demo notebook in it, signed as trusted, and what was
    done with an edited copy found there (moved aside; kept with ``keep``), if any. With
    no folder: a new temporary one (see :func:`folder_for`)."""
    source = notebook_source()
    if folder is None:
        target = Path(tempfile.mkdtemp(prefix="gpumem-demo-"))
    else:
        target = Path(folder).expanduser()
        if target.exists() and not target.is_dir():
            raise CliUsageError(f"--dir {folder}: is a file, not a folder")
        target.mkdir(parents=True, exist_ok=True)
    dest = target / NOTEBOOK
    said = None
    if dest.exists() and dest.read_bytes() != source.read_bytes():
        if keep:
            said = f"opening your copy as it is (--keep): {dest}"
        else:
            aside = _free_name(target)
            dest.rename(aside)
            said = f"your edited copy was moved to {aside}; the demo opens the recorded one"
    if not dest.exists():
        shutil.copyfile(source, dest)
    sign(dest)
    return target, said


def _free_name(folder: Path) -> Path:
    n = 1
    while (folder / f"demo-edited-{n}.ipynb").exists():
        n += 1
    return folder / f"demo-edited-{n}.ipynb"


def sign(path: Path) -> None:
    """Trust the notebook (Jupyter's notary, in the user's Jupyter data folder), as *Trust
    Notebook* does: its recorded pictures are then drawn, not sanitised to text."""
    import nbformat
    from nbformat.sign import NotebookNotary

    nb = nbformat.read(str(path), as_version=4)
    NotebookNotary().sign(nb)


@contextmanager
def folder_for(folder: str | None, keep: bool) -> Iterator[tuple[Path, str | None]]:
    """:func:`prepare`, and a temporary folder removed afterwards (kernels write
    checkpoints into it)."""
    target, said = prepare(folder, keep)
    try:
        yield target, said
    finally:
        if folder is None:
            shutil.rmtree(target, ignore_errors=True)


def url_path() -> str:
    """The path the server opens and prints: the notebook itself, not the launcher."""
    return f"/lab/tree/{NOTEBOOK}"


def lab_command(folder: Path, args: argparse.Namespace) -> list[str]:
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        raise CliUsageError(
            "the demo opens JupyterLab, which is not installed in this Python: "
            f"{sys.executable} -m pip install 'jupyterlab>=4.4,<5'"
        ) from None
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}"]
    cmd.append(f"--LabApp.default_url={url_path()}")
    if args.port is not None:
        cmd.append(f"--port={args.port}")
    if args.ip is not None:
        cmd.append(f"--ip={args.ip}")
    if args.no_browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def _stop_on_sigterm() -> None:
    """SIGTERM stops the demo as Ctrl+C does, so its temporary folder is removed too."""
    import signal
    import threading

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


def run(args: argparse.Namespace, say: object = None) -> int:
    env = kernel_env()
    if args.print_env:
        for name, value in env.items():
            print(f"export {name}={value}")
        print(f"# and start the kernel with the player loaded: --ext={PLAYER}")
        return 0
    tell = say if callable(say) else print
    _stop_on_sigterm()
    with (
        folder_for(args.dir, getattr(args, "keep", False)) as (folder, said),
        tempfile.TemporaryDirectory(prefix="gpumem-demo-kernel-") as kernels,
    ):
        write_kernel_spec(Path(kernels))
        paths = [kernels, *filter(None, [os.environ.get("JUPYTER_PATH")])]
        env["JUPYTER_PATH"] = os.pathsep.join(paths)
        cmd = lab_command(folder, args)
        tell(f"demo: {folder / NOTEBOOK}")
        if said:
            tell(f"demo: {said}")
        tell(
            f"demo: the kernel plays back the notebook as recorded on {recorded_on()}; "
            "every output and the panel say so. Ctrl+C stops the server"
            + (" and removes this folder." if args.dir is None else ".")
        )
        if "--allow-root" in cmd:
            tell("demo: running as root, so JupyterLab is started with --allow-root")
        proc = subprocess.Popen(cmd, env={**os.environ, **env})
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                return proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                return 130
