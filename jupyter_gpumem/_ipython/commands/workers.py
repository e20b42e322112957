"""``%gpumem workers [watch|unwatch] [--ranks 1,2,...]``: worker processes of this notebook
and their own GPU memory; ``watch``: read the other ranks of this kernel's
torch.distributed group from its store."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from ...reporters import bundles

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    from IPython.display import display

    from ...collectors import distributed, workers

    if args.action == "watch":
        try:
            w = distributed.watch_store(ranks=args.ranks)
        except (RuntimeError, ValueError) as e:
            raise UsageError(f"%gpumem workers watch: {e}") from None
        print(f"gpumem: reading ranks {', '.join(map(str, w.ranks))} from the group's store")
        return
    if args.action == "unwatch":
        distributed.stop_watching()
        print("gpumem: no longer reading the group's store")
        return
    if "ray" in sys.modules:  # what Ray workers sent (collectors/ray_workers.py)
        from ...collectors import ray_workers

        ray_workers.poll(workers.channel(), ray_workers.WAIT)
    live = workers.live()
    error = workers.channel().error
    if error:
        print(f"gpumem: {error}: worker processes cannot report here")
        return
    if not live:
        print(
            "gpumem: no worker process has reported. Processes forked while a measured "
            "cell runs report by themselves; a spawned one, or a Ray task or actor, calls "
            "jupyter_gpumem.report_worker(), a rank of a torch.distributed job "
            "jupyter_gpumem.report_to_store() (then `%gpumem workers watch` here)."
        )
        return
    display(bundles.workers(live), raw=True)
