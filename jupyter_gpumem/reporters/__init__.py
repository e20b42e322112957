"""Views of the model: pure functions from records to text, HTML or tables;
``bundles.py`` pairs them for Jupyter (importing this package registers them)."""

from __future__ import annotations

from . import bundles
from ._rows import compact_line
from .html import cell_report_html, measurement_html, table_html
from .text import cell_report_text, measurement_text, table_text

__all__ = [
    "bundles",
    "cell_report_html",
    "cell_report_text",
    "compact_line",
    "measurement_html",
    "measurement_text",
    "table_html",
    "table_text",
]
