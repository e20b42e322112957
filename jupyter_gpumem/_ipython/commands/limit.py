"""``%gpumem limit 24GiB|0.3|off [-d N]``: cap PyTorch's memory on a device."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from ...core import actions
from ...errors import ActionRefused
from ...reporters.actions import limit_lines
from ..command_parsers import device_of

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    device = device_of(args)
    if device is None:
        device = 0
    try:
        fraction, nbytes = actions.parse_limit(args.spec)
    except ActionRefused as e:
        raise UsageError(f"limit: {e}") from None
    r = actions.set_limit(session.collector, device, fraction=fraction, nbytes=nbytes)
    for line in limit_lines(device, r.fraction, r.bytes, r.initialised_cuda, r.reserved_over_cap):
        print(line)
