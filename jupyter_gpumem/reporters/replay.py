"""The sentence every view shows above replayed figures."""

from __future__ import annotations

from ..collectors.torch_build import torch_version
from ..model import Replay


def replay_sentence(replay: Replay) -> str:
    """The recording's GPU, torch and day, with this kernel's torch as it is now (read
    when the sentence is made: torch is often imported after the replay began)."""
    return replay.describe(torch_version())
