"""``GET /api/gpumem/devices``: the GPUs, the processes on them, and the notebooks those
processes are (docs/server.md). Authenticated and authorized like the server's own kernel
API (resource ``kernels``, action ``read``): a request without a valid token gets 403."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from .cache import GpuCache
from .gpus import gpu_table, kernels_of, session_paths
from .kernel_figures import KernelFigures


class DevicesHandler(APIHandler):
    auth_resource = "kernels"

    @property
    def gpu_cache(self) -> GpuCache:
        cache: GpuCache = self.settings["gpumem_cache"]
        return cache

    @web.authenticated
    @authorized
    async def get(self) -> None:
        reading = await asyncio.wrap_future(self.gpu_cache.refresh())  # read off the loop
        paths: dict[str, str] = {}
        session_manager = self.settings.get("session_manager")
        if session_manager is not None:
            try:
                paths = session_paths(await session_manager.list_sessions())
            except Exception as e:  # the listing is a courtesy: devices come first
                self.log.warning("jupyter_gpumem: cannot list sessions: %s", e)
        kernels = kernels_of(self.kernel_manager, paths)
        reported = None
        if reading.namespace == "foreign":  # ask the kernels themselves who they are
            figures: KernelFigures = self.settings["gpumem_kernel_figures"]
            reported = await figures.figures([k.id for k in kernels])
        table: dict[str, Any] = gpu_table(reading, kernels, reported)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(table))
