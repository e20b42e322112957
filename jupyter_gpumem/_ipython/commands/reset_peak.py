"""``%gpumem reset-peak [-d N]``: reset PyTorch's peak counters."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...core import actions
from ...reporters.actions import reset_peak_line
from ..command_parsers import device_of

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    device = device_of(args)
    actions.reset_peak(session.collector, device)
    print(reset_peak_line(device))
