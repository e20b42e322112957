"""A size shown in a notebook's HTML never wraps between its number and its unit
("64.00 / MiB" in a narrow column)."""

from __future__ import annotations

import re

from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.testing.replay import ReplayBackend
from tests.fakes import FIXTURES

_BREAKABLE_SIZE = re.compile(r"\d (B|KiB|MiB|GiB|TiB)\b")
_CELL = re.compile(r"<(td|th)([^>]*)>(.*?)</\1>", re.DOTALL)


def sizes_that_can_wrap(html: str) -> list[str]:
    """The table cells whose sizes a browser may break: a plain space between number and
    unit, and no ``white-space:nowrap`` on the cell."""
    return [
        body
        for _, attrs, body in _CELL.findall(html)
        if _BREAKABLE_SIZE.search(body) and "white-space:nowrap" not in attrs.replace(" ", "")
    ]


def test_the_check_finds_a_breakable_size():
    assert sizes_that_can_wrap("<table><tr><td>64.00 MiB</td></tr></table>") == ["64.00 MiB"]
    assert sizes_that_can_wrap("<td>64.00&nbsp;MiB</td><td>3 blocks</td>") == []
    assert sizes_that_can_wrap('<td style="white-space: nowrap">64.00 MiB</td>') == []


def test_the_panels_bars_keep_sizes_on_one_line():
    from jupyter_gpumem.protocol.convert import to_protocol
    from jupyter_gpumem.reporters.bars import sample_html

    html = sample_html(to_protocol(Collector(ReplayBackend(str(FIXTURES))).measure()))
    assert "MiB" in html and not _BREAKABLE_SIZE.search(re.sub(r"<[^>]*>", "", html))


def test_html_tables_keep_sizes_on_one_line():
    from jupyter_gpumem.reporters.html import measurement_html, table_html

    m = Collector(ReplayBackend(str(FIXTURES))).measure()
    html = measurement_html(m) + table_html(["alloc Δ"], [["+64.00 MiB"]])
    assert "MiB" in html
    assert sizes_that_can_wrap(html) == []
