"""The package's public functions: what ``import jupyter_gpumem`` offers a notebook, a
script or a worker process, beside the magics (``jupyter_gpumem/__init__.py`` re-exports
them; it holds no logic of its own).

Each imports what it needs when called, so that importing the package stays cheap and
imports neither torch nor IPython. They raise :class:`GpuMemError` when they cannot answer,
with one sentence that says what is missing: :class:`NotLoadedError` before
``%load_ext jupyter_gpumem``, :class:`NoGpuError` where PyTorch has no GPU memory to read
(torch not imported, a CPU-only build, no GPU). Bad arguments raise ``ValueError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import GpuMemError, NoGpuError, NotLoadedError

if TYPE_CHECKING:
    from ._ipython.session import Session
    from .collectors import Reading
    from .model import Measurement


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_gpumem``: register the magics, the cell hooks and the panel's
    channel in this kernel."""
    from ._ipython import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext jupyter_gpumem``: remove everything the load registered."""
    from ._ipython import unload

    unload(ipython)


def _session(what: str) -> Session:
    """The loaded extension's session; :class:`NotLoadedError` naming ``what`` without it."""
    from ._ipython import current

    session = current()
    if session is None:
        raise NotLoadedError(
            f"{what} needs the gpumem extension, which is not loaded in this kernel: "
            "run %load_ext jupyter_gpumem"
        )
    return session


def _no_gpu(what: str, now: Measurement | Reading, where: str = "kernel") -> NoGpuError | None:
    """Why PyTorch has no GPU memory for ``what`` to read, as the reading's state says;
    None when it has some or may have (CUDA not initialised yet)."""
    from .collectors.torch_build import why_no_gpu

    why = why_no_gpu(what, state=now.state, version=now.torch_version, where=where)
    return None if why is None else NoGpuError(why)


def history(n: int | None = None) -> Any:
    """The measured cells of this kernel as a pandas DataFrame (one row per cell and
    device; the last ``n`` cells when given). A cell measured without GPU figures (torch
    not imported, a CPU-only build) has one row with the device columns empty."""
    return _session("history()").history.dataframe(n)


def who(device: int | None = None, by: str = "variable", n: int | None = None) -> Any:
    """Who holds the live GPU memory of this kernel, as ``%gpumem who`` shows it: one row per
    owner (``by="variable"``), allocation line (``"line"``, needs ``%gpumem track on``) or
    cell (``"cell"``); the rows of a device add up to its ``allocated``.

    Returns a pandas DataFrame (columns ``device, by, key, detail, bytes, blocks, example,
    kind, site``) when pandas is installed, else the list of
    :class:`~jupyter_gpumem.model.WhoReport` records. Call it between cells, not from a
    thread while a cell runs.

    No rows while CUDA is not initialised (PyTorch holds nothing yet); raises
    :class:`NoGpuError` without torch, with a CPU-only build or without a GPU.
    """
    from .errors import ActionRefused

    session = _session("who()")
    if by not in ("variable", "line", "cell"):
        raise ValueError(f"by must be 'variable', 'line' or 'cell', not {by!r}")
    now = session.collector.measure(with_process=False)
    missing = _no_gpu("who()", now)
    if missing is not None:
        raise missing
    reports = []
    if now.state != "not_initialized":
        try:
            reports = session.who.who(device, by, n)  # type: ignore[arg-type]
        except ActionRefused as e:
            raise GpuMemError(f"who(): {e}") from None
    try:
        import pandas as pd
    except ImportError:
        return reports
    from .protocol.convert import to_protocol

    records = [
        {"device": r.device, "by": r.by, **to_protocol(row)} for r in reports for row in r.rows
    ]
    columns = ["device", "by", "key", "detail", "bytes", "blocks", "example", "kind", "site"]
    return pd.DataFrame.from_records(records, columns=columns)


def free(*names: str, dry: bool = False) -> Any:
    """Get the GPU memory of the named objects back without restarting the kernel, as
    ``%gpumem free`` does: ``free("model", "opt")``. Everything that keeps it alive is let
    go (the names and their aliases, ``Out[N]`` and ``_``, the kept traceback, optimizers
    over its parameters, autograd graphs hanging from other names, hooks and closures,
    accelerate's and vLLM's own references); then ``gc.collect()`` and ``empty_cache()``.
    ``dry=True``: only the plan. Returns the
    :class:`~jupyter_gpumem.model.free.FreeReport` (it shows itself): what was let go, the
    bytes expected back and, per device, the bytes that came back to the driver
    (``cudaMemGetInfo``) and what still holds the rest. Call it between cells.

    Raises :class:`GpuMemError` with the reason when there is nothing to free (an unknown
    name, torch not imported, CUDA not initialised, no GPU memory held)."""
    from .errors import ActionRefused
    from .reporters import free as _views  # noqa: F401  (registers the view)

    session = _session("free()")
    try:
        return session.frees.free(list(names), dry=dry)
    except ActionRefused as e:
        raise GpuMemError(f"free(): {e}") from None


def breakdown() -> Any:
    """What the peak of the last ``%%gpumem --breakdown`` cell was made of, as a pandas
    DataFrame (one row per device and category: ``device, category, bytes, blocks, share,
    phase, peak``), or the list of :class:`~jupyter_gpumem.model.Breakdown` records when
    pandas is not installed. Raises :class:`GpuMemError` before the first such cell
    (:class:`NoGpuError` where no such cell can run: no torch, a CPU-only build)."""
    session = _session("breakdown()")
    report = session.last_breakdown
    if report is None:
        missing = _no_gpu("breakdown()", session.collector.measure(with_process=False))
        if missing is not None:
            raise missing
        raise GpuMemError("no breakdown yet: run a cell with %%gpumem --breakdown")
    items = list(report.breakdowns)
    try:
        import pandas as pd
    except ImportError:
        return items
    records = [
        {
            "device": b.device,
            "category": c.category,
            "bytes": c.bytes,
            "blocks": c.blocks,
            "share": c.bytes / b.peak if b.peak else 0.0,
            "phase": b.phase,
            "peak": b.peak,
        }
        for b in items
        for c in b.categories
    ]
    return pd.DataFrame.from_records(records)


def dry_run(
    fn: Any,
    *args: Any,
    fit_in: str | int | None = None,
    world_size: int = 1,
    count_untouched: bool = False,
    **kwargs: Any,
) -> Any:
    """Plan without running: ``fn(*args, **kwargs)`` runs under PyTorch's FakeTensorMode
    (no device memory is used, no kernel runs) and the storages it makes are replayed
    through a model of PyTorch's caching allocator. Returns a
    :class:`~jupyter_gpumem.model.DryRun` (it shows itself in a notebook): each device's
    predicted peak allocated and reserved in a fresh process, the memory beside PyTorch
    and, with ``fit_in`` (``"24GiB"`` or a card such as ``"RTX4090"``), whether it fits.
    Build the model inside ``fn`` (under ``with torch.device("cuda")``, or with ``.cuda()``)
    to plan one this GPU cannot hold: nothing is initialised for real. ``world_size=N``:
    ``fn`` runs as rank 0 of a job of N processes, with PyTorch's fake process group as
    the job's group (its own ``fully_shard``, DDP or ``ZeroRedundancyOptimizer`` shard as
    on rank 0), and the prediction is one rank's.
    Raises :class:`NoGpuError` without torch or with a CPU-only build, and
    :class:`GpuMemError` for a world size that is not a whole number from 1 to 65536 or
    when this process already has a process group."""
    import sys

    from .analysis.targets import parse_target
    from .collectors.dry_run import check_world_size, refusal
    from .collectors.torch_build import why_no_gpu
    from .core.dry_run import dry_run as run
    from .reporters import bundles  # noqa: F401  (the result shows itself: its views)

    world_size = check_world_size(world_size)
    no_gpu = why_no_gpu("dry_run()")
    if no_gpu is not None:
        raise NoGpuError(no_gpu)
    why = refusal(world_size)
    if why is not None:
        raise GpuMemError(why)
    target = parse_target(fit_in, "fit_in") if fit_in is not None else None
    session = None
    if "IPython" in sys.modules:  # a loaded extension: it measures this GPU's context
        from ._ipython import current

        session = current()
    here = None
    if session is not None:
        from ._ipython.dry_run_cell import here as measured_here

        here = measured_here(session, 0)
    return run(
        lambda: fn(*args, **kwargs),
        target=target,
        here=here,
        world_size=world_size,
        count_untouched=count_untouched,
    )


def scan(
    fn: Any,
    values: Any,
    fit_in: str | int | None = None,
    verify: bool = True,
    device: int | None = None,
    name: str = "value",
) -> Any:
    """The largest value that fits, as ``%%gpumem --scan`` finds it, for a function:
    ``fn(value)`` runs once per value (its result is dropped), the peaks are fitted, the
    largest value within ``fit_in`` (a size like ``"24GiB"`` or a GPU like ``"T4"``;
    default: what this GPU has free now) is predicted and, unless ``verify=False``, run
    under that cap. Returns a :class:`~jupyter_gpumem.model.ScanResult`, which shows
    itself as the report in a notebook. ``values``: two to eight positive numbers, by the
    rule of ``--scan`` (ValueError otherwise, with its text). Raises :class:`NoGpuError`
    without torch, with a CPU-only build or without a GPU; works without the extension
    loaded."""
    from .analysis.targets import parse_target
    from .core.scan_values import scan_values
    from .core.scanner import Scanner, target_refusal
    from .errors import ScanStopped
    from .reporters import bundles  # noqa: F401  (the result shows itself: its views)

    vals, integer = scan_values(values)  # the rule of %%gpumem --scan: ValueError
    target = parse_target(fit_in, "fit_in") if fit_in is not None else None
    from ._ipython import current

    session = current()
    from .collectors import Collector, worker_sources

    collector = (
        session.collector if session is not None else Collector(workers=worker_sources.sources())
    )
    missing = _no_gpu("scan()", collector.measure(with_process=False))
    if missing is not None:
        raise missing
    refused = target_refusal(collector, target, device)
    if refused is not None:
        raise ValueError(refused)

    def run(value: float) -> BaseException | None:
        try:
            fn(int(value) if integer else value)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            return e
        return None

    try:
        result = Scanner(collector, run, lambda: None, device).scan(
            name, vals, target, verify, integer
        )
    except ScanStopped as stop:
        if stop.error is not None:
            raise stop.error from None
        raise GpuMemError(f"scan stopped: {stop}") from None
    if session is not None:
        session.scans = [*session.scans[-19:], result]
    return result


def report_worker(final: bool = False) -> bool:
    """Call at the top of a *spawned* worker process (``start_method="spawn"``), or of a
    Ray task or actor, so that the notebook's measured cells show the worker's own GPU
    memory, as they show forked workers by themselves; torch need not be imported yet
    (the reports start once CUDA is). True when the kernel was found
    (``JUPYTER_GPUMEM_WORKERS``; in a Ray worker, its job's mailbox, which the kernel makes
    at its first measured cell after ``ray.init()``); False, and nothing happens,
    elsewhere, and in a worker whose torch is a CPU-only build (no GPU memory to report).
    Raises :class:`GpuMemError` in the kernel itself.

    In a Ray worker each call sends the figures at once. ``final=True`` sends them as the
    worker's last report (status *exited*): the last line of a Ray task, whose process Ray
    ends before any exit handler could report. See docs/workers.md."""
    import os
    import sys

    from .collectors import make_backend
    from .collectors.workers import WORKERS_ENV, channel, process, report_from_worker

    kernel = channel()
    if kernel.address is not None and kernel._owner == os.getpid():
        raise GpuMemError(
            "report_worker() is for the kernel's worker processes: this is the kernel, "
            "whose own GPU memory measured cells show already"
        )
    ray: Any = None
    if "ray" in sys.modules:  # never imported here: a Ray worker has it already
        from .collectors import ray_workers

        ray = ray_workers if ray_workers.in_worker() else None
    if ray is None and not os.environ.get(WORKERS_ENV):
        return False
    if make_backend().read(with_process=False, full=False).state == "cpu_only":
        return False
    if ray is not None:
        found = ray.report_from_ray(final)
        if found is not None:
            return found
        if not os.environ.get(WORKERS_ENV):
            return False  # a Ray job whose driver is no notebook of ours
    if final and process._reporter is not None:
        process._reporter.final()
        return True
    return report_from_worker()


def report_to_store(store: Any = None, rank: int | None = None) -> Any:
    """Call in each rank of a ``torch.distributed`` job whose rank 0 is this notebook's
    kernel (after ``init_process_group``): the rank's own GPU memory then reaches the
    kernel through the job's store, wherever the rank runs. See docs/workers.md.

    Raises :class:`GpuMemError` without a process group (pass ``store`` and ``rank``
    then) and :class:`NoGpuError` in a rank whose torch is a CPU-only build."""
    from .collectors import make_backend
    from .collectors.distributed import report_to_store as start

    missing = _no_gpu(
        "report_to_store()", make_backend().read(with_process=False, full=False), "process"
    )
    if missing is not None:
        raise missing
    try:
        return start(store, rank)
    except RuntimeError as e:
        raise GpuMemError(f"report_to_store(): {e}") from None


def watch_store(store: Any = None, ranks: Any = None) -> Any:
    """Call once in the kernel, a member of the job: measured cells and the panel then
    show the other ranks' figures (those that call ``report_to_store``). The kernel needs
    no GPU of its own. Raises :class:`GpuMemError` without a process group (pass
    ``store`` then)."""
    from .collectors.distributed import watch_store as start

    try:
        return start(store, ranks)
    except RuntimeError as e:
        raise GpuMemError(f"watch_store(): {e}") from None


# The hooks jupyter_server and JupyterLab look up in the package.
def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_gpumem"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from .server import load

    load(serverapp)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-gpumem"}]
