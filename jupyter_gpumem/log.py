"""The ``jupyter_gpumem`` logger, and the one line a user sees when the tool itself fails.

The tool never breaks the user's cell: when a reading or an analysis fails, the user gets
one line on stderr (``gpumem: warning: ...``) and the logger gets the traceback, for
whoever configures logging (``logging.getLogger("jupyter_gpumem")``).
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("jupyter_gpumem")
# A library's logger: silent unless the application configures logging (without this,
# logging's last-resort handler would print each warning a second time).
logger.addHandler(logging.NullHandler())


def warn(message: str, exc_info: bool = True) -> None:
    """Tell the user in one line; log the details (the exception being handled, if any)."""
    print(f"gpumem: warning: {message}", file=sys.stderr)
    logger.warning(message, exc_info=exc_info)
