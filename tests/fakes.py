"""Test doubles fed with readings recorded on a real GPU (tests/fixtures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jupyter_gpumem.collectors.readings import Reading
from jupyter_gpumem.testing.replay import reading_from_raw

FIXTURES = Path(__file__).parent.parent / "jupyter_gpumem/testing/recorded/gpu_readings.json"
RECORDED: dict[str, Any] = json.loads(FIXTURES.read_text())


class ScriptedBackend:
    """Returns the given raw readings in order (the last one repeats)."""

    def __init__(self, *raws: dict[str, Any], fail: bool = False) -> None:
        self.raws = list(raws)
        self.reads = 0
        self.resets: list[list[int] | None] = []
        self.fail = fail

    def read(self, with_process: bool = True, full: bool = True) -> Reading:
        if self.fail:
            raise RuntimeError("driver exploded")
        raw = self.raws[min(self.reads, len(self.raws) - 1)]
        self.reads += 1
        return reading_from_raw(raw)

    def initialized_devices(self) -> list[int]:
        return [d["index"] for d in self.raws[-1]["devices"] if d["initialized"]]

    def device_count(self) -> int:
        return len(self.raws[-1]["devices"])

    def reset_peaks(self, devices: list[int] | None = None) -> None:
        self.resets.append(devices)

    def attach_oom_observer(self, callback: Any) -> bool:
        return False

    def cuda_ready(self) -> bool:
        return True

    def replay(self) -> None:
        return None  # its figures stand for live ones


def scenario(name: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    s = RECORDED["scenarios"][name]
    return s["before"], s["after"], s["truth"]
