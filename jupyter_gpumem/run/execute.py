"""Run a notebook headless through nbclient, with the extension in auto mode, and collect
what the kernel measured for each cell.

The kernel stays the source of the numbers: after each code cell the runner asks it, on
the control channel, for its last measured cell (protocol action ``history``, n=1) and
matches the record by execution count. Nothing here measures memory itself.

Before the first cell a silent setup step (not a notebook cell: no execution count, no
output in the executed notebook) runs ``%load_ext jupyter_gpumem`` and
``%gpumem auto on``; with ``--fits SIZE`` it imports torch and caps PyTorch's memory on
device 0 through the protocol's ``set_limit``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import KernelLost, RunError, is_out_of_memory_text
from .budgets import Budget, BudgetResult

REQUEST_TIMEOUT_S = 10.0
WHO_TIMEOUT_S = 20.0
MIN_REVISION = 3  # the protocol revision that added the history action
TIMEOUT = "CellTimeout"  # the error a cell past --timeout gets
# "error": it raised; "skipped": tagged skip-execution
CellStatus = Literal["ok", "error", "skipped", "not_run"]


@dataclass
class CellRun:
    """One code cell of the notebook and what the kernel measured for it."""

    index: int  # position in the notebook, 0-based
    first_line: str
    budgets: list[Budget]  # what this cell must satisfy (its tags, then the global ones)
    source: str = ""  # the cell's code (what a comparison of runs matches cells by)
    status: CellStatus = "not_run"
    execution_count: int | None = None
    error: tuple[str, str] | None = None  # (ename, evalue)
    expected_error: bool = False  # tagged raises-exception
    wall_time: float | None = None  # the kernel's figure when measured, else ours
    measured: bool = False  # the kernel has a history record for it
    # HistoryCell devices: the kernel's, then its workers' (with "worker": "rank 1 (pid 7)");
    # with ``detail``, the kernel's also have LastCell's peak_reserved, kept_lines, breakdown
    devices: list[dict[str, Any]] = field(default_factory=list)
    oom: bool = False  # ran out of GPU memory (errors.is_out_of_memory_text)
    oom_fix: str | None = None  # the first fix of the kernel's post-mortem
    results: list[BudgetResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``cell 5 [3] `x = f()```: the notebook position (1-based), the execution count
        the executed notebook shows, and the first line of code."""
        n = f" [{self.execution_count}]" if self.execution_count is not None else ""
        line = self.first_line if len(self.first_line) <= 60 else self.first_line[:59] + "…"
        return f"cell {self.index + 1}{n} `{line}`"

    @property
    def has_figures(self) -> bool:
        return any(d.get("peak_allocated") is not None for d in self.devices)

    @property
    def failed_budgets(self) -> list[BudgetResult]:
        return [r for r in self.results if r.ok is False]


@dataclass
class RunResult:
    notebook: Any  # the executed nbformat NotebookNode
    kernel: str
    cells: list[CellRun]
    started: float  # unix seconds
    duration: float = 0.0
    kernel_version: str | None = None  # jupyter-gpumem in the kernel
    sample: dict[str, Any] | None = None  # the protocol's Sample at the end
    limit: dict[str, Any] | None = None  # the cap set for --fits: {device, bytes, fraction}
    stopped: str | None = None  # why the run ended early (exit 2)
    notes: list[str] = field(default_factory=list)  # warnings for the user
    # the Sample's replay (protocol ``Replay``) when the kernel replays a recording: its
    # figures were recorded elsewhere, not measured here
    replay: dict[str, Any] | None = None

    @property
    def has_figures(self) -> bool:
        return any(c.has_figures for c in self.cells)


def first_code_line(source: str) -> str:
    for line in source.splitlines():
        s = line.strip()
        if s:
            return s[:200]
    return ""


def _silent_logger() -> logging.Logger:
    log = logging.getLogger("jupyter_gpumem.run.nbclient")
    log.propagate = False
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    return log


class Runner:
    def __init__(
        self,
        nb: Any,
        path: Path,
        cells: Sequence[CellRun],
        *,
        kernel: str | None = None,
        fits: int | None = None,
        allow_errors: bool = False,
        timeout: int | None = None,
        startup_timeout: int = 60,
        progress: Callable[[CellRun, int, int], None] | None = None,
        detail: bool = False,
        track: bool = False,
        breakdown_all: bool = False,
    ) -> None:
        self.nb = nb
        self.path = path
        self.cells = list(cells)
        self.kernel = kernel or nb.metadata.get("kernelspec", {}).get("name") or "python3"
        self.fits = fits
        self.allow_errors = allow_errors
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.progress = progress
        self.detail = detail  # ask for each cell's last_cell (peak reserved, lines, breakdown)
        self.track = track  # tracking on in the setup step (the lines that allocated what is kept)
        self.breakdown_all = breakdown_all  # every cell gets --breakdown (auto on --breakdown)
        self.client: Any = None
        self._reply: dict[str, Any] | None = None
        self._answering = True  # the kernel answers gpumem requests

    # -- kernel messages -------------------------------------------------------------
    async def request(
        self, action: str, timeout: float = REQUEST_TIMEOUT_S, **args: Any
    ) -> dict[str, Any] | None:
        """Send a ``gpumem_request`` on the control channel; the reply's content, or None
        when none came in time."""
        kc = self.client.kc
        msg = kc.session.msg("gpumem_request", {"protocol": 1, "action": action, "args": args})
        kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                reply = await kc.control_channel.get_msg(timeout=left)
            except queue.Empty:
                return None
            if reply.get("parent_header", {}).get("msg_id") == msg["header"]["msg_id"]:
                return dict(reply["content"])

    async def silent(self, code: str) -> dict[str, Any]:
        """Run code without an execution count or history; its execute_reply content."""
        kc = self.client.kc
        msg_id = kc.execute(code, silent=True, store_history=False)
        reply = await self.client.async_wait_for_reply(msg_id)
        if reply is None:
            raise RunError(f"the kernel did not answer the setup step ({code!r})")
        return dict(reply["content"])

    async def setup(self, result: RunResult) -> None:
        reply = await self.silent("%load_ext jupyter_gpumem")
        if reply["status"] != "ok":
            raise RunError(
                f"the kernel {self.kernel!r} could not load jupyter_gpumem "
                f"({reply.get('ename')}: {reply.get('evalue')}); install jupyter-gpumem in "
                "that kernel's environment"
            )
        hello = await self.request("hello")
        if hello is None or hello.get("status") != "ok":
            raise RunError(
                "the kernel loaded jupyter_gpumem but does not answer its requests"
                + (f" ({hello['error']['message']})" if hello and "error" in hello else "")
            )
        info = hello["result"]
        result.kernel_version = info.get("version")
        result.replay = (info.get("sample") or {}).get("replay")
        if info.get("revision", 0) < MIN_REVISION or "history" not in info.get("actions", []):
            raise RunError(
                f"the kernel's jupyter-gpumem {info.get('version')} is too old for "
                "`jupyter-gpumem run` (it needs the protocol's history action): upgrade it in "
                "the kernel's environment"
            )
        if self.fits is not None:
            await self.cap(result)
        if self.detail and "last_cell" not in info.get("actions", []):
            raise RunError(
                f"the kernel's jupyter-gpumem {info.get('version')} is too old to record each "
                "cell's peak reserved, kept lines and breakdown (the protocol's last_cell "
                "action): upgrade it in the kernel's environment"
            )
        if self.track:
            reply = await self.silent("%gpumem track on")
            if reply["status"] != "ok":
                raise RunError(f"could not switch tracking on: {reply.get('evalue')}")
        auto = "%gpumem auto on" + (" --breakdown" if self.breakdown_all else "")
        reply = await self.silent(auto)
        if reply["status"] != "ok":
            why = f"could not switch auto mode on: {reply.get('evalue')}"
            if self.breakdown_all:
                why += (
                    " (--breakdown-all: the kernel's jupyter-gpumem may be older than this "
                    "command; upgrade it there)"
                )
            raise RunError(why)

    async def cap(self, result: RunResult) -> None:
        from ..units import format_bytes

        size = format_bytes(self.fits)
        reply = await self.silent('__import__("torch")')
        if reply["status"] != "ok":
            raise RunError(
                f"--fits {size}: the kernel cannot import torch "
                f"({reply.get('ename')}: {reply.get('evalue')})"
            )
        answer = await self.request("set_limit", device=0, bytes=self.fits)
        if answer is None:
            raise RunError(f"--fits {size}: the kernel did not answer the request for a cap")
        if answer.get("status") != "ok":
            raise RunError(f"--fits {size}: cannot cap GPU memory: {answer['error']['message']}")
        limit = answer["result"].get("limit")
        result.limit = {"device": 0, **limit} if limit else None

    async def measured(self, cell: CellRun) -> None:
        """Ask the kernel for its last measured cell; keep it when it is this one."""
        if not self._answering or cell.execution_count is None:
            return
        reply = await self.request("history", n=1)
        if reply is None:
            self._answering = False
            raise KernelLost()
        if reply.get("status") != "ok":
            return
        rows = reply["result"]["cells"]
        if rows and rows[-1]["execution_count"] == cell.execution_count:
            row = rows[-1]
            cell.measured = True
            cell.devices = [{**d, "touched": True} for d in row["devices"]]
            cell.wall_time = float(row["wall_time"])
            if all(d.get("worker") for d in cell.devices):  # none of the kernel's own
                await self.untouched(cell)
            if self.detail:
                await self.details(cell)

    async def details(self, cell: CellRun) -> None:
        """The kernel's devices' peak reserved, the lines that allocated what the cell
        kept (tracking on) and its breakdown (``--breakdown``): the ``last_cell`` action,
        when it is this cell."""
        reply = await self.request("last_cell")
        if reply is None or reply.get("status") != "ok":
            return
        last = reply["result"]["cell"]
        if last is None or last["execution_count"] != cell.execution_count:
            return
        found = {d["index"]: d for d in last["devices"]}
        for d in cell.devices:
            extra = found.get(d["index"]) if not d.get("worker") else None
            if extra is not None:
                d["peak_reserved"] = extra["peak_reserved"]
                d["kept_lines"] = extra["kept_lines"]
                d["breakdown"] = extra["breakdown"]

    async def untouched(self, cell: CellRun) -> None:
        """A history record lists only the devices a cell changed. On the others the cell
        kept nothing and its peak was what was allocated, before and after alike: read
        that from a sample taken now (nothing ran since the cell ended)."""
        reply = await self.request("sample")
        if reply is None or reply.get("status") != "ok":
            return
        for d in reply["result"]["sample"]["devices"]:
            if d.get("initialized") and d.get("allocated") is not None:
                cell.devices.append(
                    {
                        "index": d["index"],
                        "allocated": d["allocated"],
                        "allocated_delta": 0,
                        "reserved": d["reserved"],
                        "reserved_delta": 0,
                        "peak_allocated": d["allocated"],
                        "peak_above_start": 0,
                        "peak_reserved": d["reserved"],
                        "kept_at": None,
                        "ooms": 0,
                        "touched": False,
                    }
                )

    async def postmortem_fix(self, cell: CellRun) -> None:
        """The first fix of the kernel's post-mortem of the cell that ran out of memory
        (the ``who`` action carries the last post-mortem)."""
        if not self._answering:
            return
        reply = await self.request("who", timeout=WHO_TIMEOUT_S, n=1)
        if reply is None or reply.get("status") != "ok":
            return
        for pm in reply["result"].get("postmortems", []):
            fixes = pm.get("fixes") or []
            if fixes:
                cell.oom_fix = str(fixes[0]["text"])
                return

    # -- the run ---------------------------------------------------------------------
    def _on_executed(self, **kw: Any) -> None:
        self._reply = kw.get("execute_reply")

    async def run(self) -> RunResult:
        from jupyter_client.kernelspec import NoSuchKernel
        from nbclient import NotebookClient
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        result = RunResult(self.nb, self.kernel, self.cells, time.time())
        t0 = time.monotonic()
        self.client = NotebookClient(
            self.nb,
            kernel_name=self.kernel,
            timeout=self.timeout,
            # A cell past --timeout is interrupted, so that the kernel ends it and shuts
            # down cleanly; the runner sees this error and stops.
            interrupt_on_timeout=True,
            error_on_timeout={"ename": TIMEOUT, "evalue": f"ran longer than {self.timeout} s"},
            startup_timeout=self.startup_timeout,
            allow_errors=True,  # the runner decides what an error means
            resources={"metadata": {"path": str(self.path.parent)}},
            log=_silent_logger(),
            on_cell_executed=self._on_executed,
        )
        # The kernel's own stderr (ipykernel's warnings, its tracebacks when it shuts down
        # while a message is on its way) goes to a file, not to this tool's output; its
        # last lines are shown when the kernel fails to start or dies.
        self._kernel_log = tempfile.TemporaryFile()
        try:
            async with self.client.async_setup_kernel(stderr=self._kernel_log):
                info = await self.client.async_wait_for_reply(self.client.kc.kernel_info())
                if info is not None and "language_info" in info["content"]:
                    self.nb.metadata["language_info"] = info["content"]["language_info"]
                await self.setup(result)
                await self.execute_cells(result)
                if self._answering:
                    s = await self.request("sample")
                    if s is not None and s.get("status") == "ok":
                        result.sample = s["result"]["sample"]
                        result.replay = result.sample.get("replay", result.replay)
        except NoSuchKernel:
            raise RunError(
                f"no kernel named {self.kernel!r} here (`jupyter kernelspec list` shows "
                "them); choose one with --kernel NAME"
            ) from None
        except DeadKernelError:
            self._interrupted("DeadKernelError", "the kernel died")
            result.stopped = "the kernel died" + self._where() + self._last_words()
        except CellTimeoutError:
            self._interrupted(TIMEOUT, f"ran longer than {self.timeout} s")
            result.stopped = f"a cell ran longer than --timeout {self.timeout} s" + self._where()
        except RunError:
            raise
        except RuntimeError as e:  # kernel start-up failures surface as RuntimeError
            if self._current is None and not any(c.status != "not_run" for c in self.cells):
                raise RunError(
                    f"the kernel {self.kernel!r} did not start: {e}{self._last_words()}"
                ) from None
            self._interrupted(type(e).__name__, str(e))
            result.stopped = f"the kernel failed: {e}" + self._where()
        finally:
            result.duration = time.monotonic() - t0
            self._kernel_log.close()
            # nbclient cleans its kernel up at exit too; after a failed start that handler
            # fails with a traceback of its own (nbclient 0.10: `assert self.km`). The
            # context manager above already shut the kernel down.
            atexit.unregister(self.client._cleanup_kernel)
        for c in self.cells:
            if c.status == "not_run":
                nb_cell = self.nb.cells[c.index]
                nb_cell.outputs = []
                nb_cell.execution_count = None
        return result

    _current: CellRun | None = None
    _kernel_log: Any = None

    def _last_words(self) -> str:
        """The last lines the kernel wrote to its stderr, for a failure message."""
        log = self._kernel_log
        if log is None or log.closed:
            return ""
        try:
            log.flush()
            size = log.seek(0, 2)
            log.seek(max(0, size - 2000))
            text = log.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()][-8:]
        return "; the kernel's last output:\n  " + "\n  ".join(lines) if lines else ""

    def _interrupted(self, ename: str, evalue: str) -> None:
        """The cell that was running when the run broke off ran, and did not end well."""
        c = self._current
        if c is not None:
            c.status = "error"
            c.error = (ename, evalue)

    def _where(self) -> str:
        c = self._current
        return f" while running {c.label}" if c is not None else ""

    async def execute_cells(self, result: RunResult) -> None:
        total = len(self.cells)
        for k, cell in enumerate(self.cells, 1):
            self._current = cell
            nb_cell = self.nb.cells[cell.index]
            self._reply = None
            t = time.monotonic()
            await self.client.async_execute_cell(nb_cell, cell.index)
            elapsed = time.monotonic() - t
            if self._reply is None:  # nbclient skipped it (tagged skip-execution)
                cell.status = "skipped"
                if self.progress is not None:
                    self.progress(cell, k, total)
                continue
            reply: dict[str, Any] = self._reply["content"]
            cell.execution_count = reply.get("execution_count", nb_cell.get("execution_count"))
            cell.wall_time = elapsed
            if reply.get("status") == "error":
                cell.status = "error"
                cell.error = (str(reply.get("ename", "")), str(reply.get("evalue", "")))
                cell.oom = is_out_of_memory_text(*cell.error)
                cell.expected_error = "raises-exception" in nb_cell.metadata.get("tags", [])
            else:
                cell.status = "ok"
            try:
                await self.measured(cell)
                if cell.oom:
                    await self.postmortem_fix(cell)
            except KernelLost:
                result.notes.append(
                    f"the kernel stopped answering jupyter-gpumem's requests after "
                    f"{cell.label} (did the notebook unload the extension?): later cells "
                    "have no figures"
                )
            if self.progress is not None:
                self.progress(cell, k, total)
            ename, evalue = cell.error or ("", "")
            if ename == TIMEOUT:  # also with --allow-errors: the run is not what it claims
                result.stopped = (
                    f"{cell.label} ran longer than --timeout {self.timeout} s (interrupted)"
                )
                break
            if cell.status == "error" and not cell.expected_error and not self.allow_errors:
                if not (cell.oom and self.fits is not None):
                    result.stopped = f"{cell.label} raised {ename}: {_clip(evalue)}"
                    if cell.oom_fix:
                        result.stopped += f"; the post-mortem's first fix: {cell.oom_fix}"
                break  # an OOM under --fits: it does not fit, exit 1 (the verdict says so)
        self._current = None


def _clip(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def run_notebook(nb: Any, path: Path, cells: Sequence[CellRun], **kw: Any) -> RunResult:
    """Run it (blocking); :class:`RunError` when it cannot start."""
    return asyncio.run(Runner(nb, path, cells, **kw).run())
