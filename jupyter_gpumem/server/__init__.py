"""jupyter_server extension: which notebook holds each GPU (``GET /api/gpumem/devices``),
GPU memory per device and per kernel on ``/metrics``, and the panel's control requests kept
from looking like activity.


Each ``gpumem_request`` makes ipykernel publish busy/idle statuses. jupyter_server would
count them as user activity (defeating idle culling), and JupyterLab would show the notebook
as idle for a moment while a cell runs. Both read ``MappingKernelManager.
untracked_message_types``; JupyterLab gets it through the page config (JupyterLab >= 4.5).
Files in ``jupyter_server_config.d`` only enable extensions, so the list is extended here.
"""

from __future__ import annotations

from typing import Any

from ..protocol import REPLY, REQUEST

OURS = (REQUEST, REPLY)


def load(serverapp: Any) -> None:
    _untrack(serverapp)
    _serve_gpus(serverapp)


def _serve_gpus(serverapp: Any) -> None:
    from jupyter_server.utils import url_path_join

    from .cache import GpuCache
    from .handlers import DevicesHandler
    from .kernel_figures import KernelFigures
    from .metrics import GpuMetrics, register

    web_app = serverapp.web_app
    cache = GpuCache(ttl=1.0)
    web_app.settings["gpumem_cache"] = cache
    web_app.settings["gpumem_kernel_figures"] = KernelFigures(serverapp.kernel_manager)
    base = web_app.settings.get("base_url", "/")
    web_app.add_handlers(".*$", [(url_path_join(base, "api/gpumem/devices"), DevicesHandler)])
    register(GpuMetrics(cache, serverapp.kernel_manager))
    cache.refresh()  # the first reading, on the worker thread
    serverapp.log.info(
        "jupyter_gpumem: GPUs at %s, metrics on /metrics", url_path_join(base, "api/gpumem/devices")
    )


def _untrack(serverapp: Any) -> None:
    km = serverapp.kernel_manager
    current = list(getattr(km, "untracked_message_types", []) or [])
    if hasattr(km, "untracked_message_types"):
        km.untracked_message_types = current + [t for t in OURS if t not in current]
    # jupyterlab_server copies the list into the page config when it loads; set it too, in
    # case it loaded before us.
    settings = serverapp.web_app.settings
    page = settings.setdefault("page_config_data", {})
    if "untracked_message_types" in page:
        page["untracked_message_types"] = list(km.untracked_message_types)
    serverapp.log.info("jupyter_gpumem: %s not tracked as kernel activity", ", ".join(OURS))
