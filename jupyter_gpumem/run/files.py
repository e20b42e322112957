"""The files a command writes: checked before anything runs (a new file in a folder it
may write to, or with --force a regular file it may overwrite; never one of its inputs),
written once the results are in."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import CliUsageError


def check_outputs(
    args: argparse.Namespace, kinds: Sequence[str], inputs: Sequence[Path]
) -> dict[str, Path]:
    """The output files named by ``args``' options ``kinds``, checked."""
    outs: dict[str, Path] = {}
    for kind in kinds:
        value = getattr(args, kind, None)
        if value is None:
            continue
        path = Path(value).expanduser()
        if path.is_dir():
            raise CliUsageError(f"--{kind} {value}: is a folder; give a file name")
        if path.is_symlink() and not path.exists():
            raise CliUsageError(
                f"--{kind} {value}: a link to {os.readlink(path)}, which does not exist; "
                "give a file name"
            )
        if path.exists() and not args.force:
            raise CliUsageError(f"--{kind} {value} exists; choose a new file name or add --force")
        if path.exists() and not path.is_file():
            raise CliUsageError(
                f"--{kind} {value}: not a regular file (a device, FIFO or socket); give a file name"
            )
        parent = path.resolve().parent
        if not parent.is_dir():
            raise CliUsageError(f"--{kind} {value}: no folder {parent}")
        if path.exists() and not os.access(path, os.W_OK):
            raise CliUsageError(f"--{kind} {value}: not writable")
        if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
            raise CliUsageError(f"--{kind} {value}: cannot create files in {parent}")
        for given in inputs:
            if path.resolve() == given.expanduser().resolve() and not args.force:
                raise CliUsageError(f"--{kind} would overwrite {given} itself")
        outs[kind] = path
    seen: dict[Path, str] = {}
    for kind, path in outs.items():
        other = seen.setdefault(path.resolve(), kind)
        if other != kind:
            raise CliUsageError(f"--{other} and --{kind} name the same file {path}")
    return outs


def write(path: Path, text: str, force: bool) -> None:
    with open(path, "w" if force else "x", encoding="utf-8") as f:
        f.write(text)
