"""From the frames PyTorch recorded for a block to what the user sees.

``In[7] line 3: out = model(x)`` for notebook cells, ``train.py:42`` for the user's own
modules, and for calls into torch or another library the first user frame with the
library frame beside it. Which file is a cell is asked of a :class:`CellNames` (IPython
maps its generated cell file names to execution counts: ``_ipython/cells.py``).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

from ..model import Frame, Site

FileKind = Literal["cell", "file", "library"]


class CellNames(Protocol):
    """Maps the file names IPython compiles cells under back to cells."""

    def execution_count(self, filename: str) -> int | None: ...
    def line_text(self, filename: str, line: int) -> str: ...
    def files_of(self, execution_count: int) -> frozenset[str]:
        """The file names a cell's code was compiled under."""
        ...


class NoCells:
    def execution_count(self, filename: str) -> int | None:
        return None

    def line_text(self, filename: str, line: int) -> str:
        import linecache

        return linecache.getline(filename, line).strip()

    def files_of(self, execution_count: int) -> frozenset[str]:
        return frozenset()


def default_library_dirs() -> tuple[str, ...]:
    """Directories whose code is not the user's: the standard library, site-packages, and
    this package (also when installed editable)."""
    dirs: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(p)
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # virtualenv's old site.py
        pass
    user = getattr(site, "getusersitepackages", lambda: "")()
    if user:
        dirs.add(user)
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        dirs.add(os.path.join(prefix, "lib"))
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return tuple(sorted(os.path.realpath(d).rstrip(os.sep) + os.sep for d in dirs if d))


class SiteResolver:
    """Classifies frames (cached per file name) and builds :class:`Site` records."""

    def __init__(
        self, cells: CellNames | None = None, library_dirs: Iterable[str] | None = None
    ) -> None:
        self.cells: CellNames = cells if cells is not None else NoCells()
        self.library_dirs = (
            tuple(library_dirs) if library_dirs is not None else default_library_dirs()
        )
        self._kinds: dict[str, FileKind] = {}
        # Sites by (innermost user frame, the library frame beside it, the cell's count):
        # tens of thousands of blocks come from a few hundred lines.
        self._sites: dict[tuple, Site] = {}

    def file_kind(self, filename: str) -> FileKind:
        kind = self._kinds.get(filename)
        if kind is None:
            # Stable once known: IPython registers a cell's file before its code runs and
            # never forgets it (a re-run changes the count, asked for in site()).
            kind = self._kinds[filename] = self._classify(filename)
        return kind

    def _classify(self, filename: str) -> FileKind:
        if self.cells.execution_count(filename) is not None:
            return "cell"
        if filename.startswith(("<frozen", "<built-in")):
            return "library"
        if filename.startswith("<"):
            return "file"  # <string>, <stdin>: code the user ran
        real = os.path.realpath(filename)
        for d in self.library_dirs:
            if real.startswith(d):
                return "library"
        return "file"

    def site(self, frames: Sequence[Frame], before_tracking: bool = False) -> Site:
        """The innermost user frame, with the innermost library frame beside it."""
        return self._site(frames, before_tracking, {})

    def sites(self, blocks: Iterable[tuple[Sequence[Frame], bool]]) -> list[Site]:
        """:meth:`site` of many blocks' (frames, before_tracking) at once: the cells' counts
        are asked once per file name (``who`` resolves tens of thousands of blocks)."""
        counts: dict[str, int | None] = {}
        site, kinds = self._site, self._kinds
        # PyTorch's snapshot shares one dict per distinct frame among all the blocks
        # (py_symbolize deduplicates them): blocks whose innermost frame is the same user
        # frame have the same site, found by that dict's identity (the dicts live as long
        # as the snapshot the frames come from, which outlives this call).
        by_first: dict[int, Site] = {}
        out = []
        for frames, before in blocks:
            if frames:
                first = frames[0]
                s = by_first.get(id(first))
                if s is None:
                    s = site(frames, before, counts)
                    if kinds.get(first["filename"]) != "library":
                        by_first[id(first)] = s
                out.append(s)
            else:
                out.append(_BEFORE if before else _NO_STACK)
        return out

    def _site(
        self, frames: Sequence[Frame], before_tracking: bool, counts: dict[str, int | None]
    ) -> Site:
        if not frames:
            return _BEFORE if before_tracking else _NO_STACK
        innermost_library: Frame | None = None
        kinds = self._kinds
        for f in frames:
            filename = f["filename"]
            kind = kinds.get(filename) or self.file_kind(filename)
            if kind == "library":
                if innermost_library is None:
                    innermost_library = f
                continue
            count = None
            if kind == "cell":
                if filename in counts:
                    count = counts[filename]
                else:
                    count = counts[filename] = self.cells.execution_count(filename)
            lib = innermost_library
            key = (
                filename,
                f["line"],
                f["name"],
                count,
                lib and (lib["filename"], lib["line"], lib["name"]),
            )
            s = self._sites.get(key)
            if s is None:
                if len(self._sites) > 100_000:
                    self._sites.clear()
                s = self._sites[key] = self._make(f, kind, lib)
            return s
        outer = frames[-1]
        return Site(
            "library",
            filename=outer["filename"],
            line=int(outer["line"]),
            function=outer["name"],
            text=self.cells.line_text(outer["filename"], int(outer["line"])),
            library=_describe(innermost_library)
            if innermost_library is not None and innermost_library is not outer
            else "",
        )

    def _make(self, f: Frame, kind: FileKind, library: Frame | None) -> Site:
        filename, line = f["filename"], int(f["line"])
        count = self.cells.execution_count(filename) if kind == "cell" else None
        return Site(
            "cell" if count is not None else "file",
            filename=filename,
            line=line,
            function=f["name"],
            execution_count=count,
            text=self.cells.line_text(filename, line),
            library=_describe(library) if library is not None else "",
        )

    def cell_line(self, frames: Sequence[Frame], cell_files: frozenset[str]) -> Frame | None:
        """The innermost frame that runs code of the given cell files, or None."""
        for f in frames:
            if f["filename"] in cell_files:
                return f
        return None


_BEFORE = Site("before_tracking")
_NO_STACK = Site("no_stack")


def _describe(f: Frame) -> str:
    from ..model import short_path

    return f"{short_path(f['filename'], 3)}:{f['line']} {f['name']}"
