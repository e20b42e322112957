"""The ``jupyter_gpumem`` logger, and the one line a user sees when the tool itself fails.

The tool never breaks the user's cell: when a reading or an analysis fails, the user gets
one line on stderr (``gpumem: warning: ...``) and the logger gets the traceback, for
whoever configures logging (``logging.getLogger("jupyter_gpumem")``).
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("jupyter_gpumem")


def warn(message: str, exc_info: bool = False) -> None:
    """Tell the user in one line; log the details."""
    print(f"gpumem: warning: {message}", file=sys.stderr)
    logger.warning(message, exc_info=exc_info)
