"""Which cell of one run is which cell of another: matched by their code, not their place.

1. The same code (trailing spaces aside) is the same cell. Cells with equal code pair up
   in order (the second ``train_step()`` with the second).
2. Of those, the cells that keep their order form the longest common run; the others
   were **moved** (when order matters: a notebook against a notebook).
3. The cells left on both sides pair up by similarity of their code (``difflib``'s
   ratio, at least :data:`SIMILAR`), the most similar first, then the nearest: an
   **edited** cell. What is still left was **added** or **removed**.
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Sequence
from typing import NamedTuple

from ..model import MatchKind

# An edited cell keeps at least this share of its code (difflib's ratio: 2 x matching
# characters / all characters): `x = f(32)` -> `x = f(64)` is 0.78; two unrelated short
# lines are usually under 0.4.
SIMILAR = 0.6
# Character-level similarity costs up to len(a) x len(b); longer cells compare by lines.
_CHARS = 20_000
CODE_LINES = 8  # changed lines shown for an edited cell


class Match(NamedTuple):
    before: int | None  # position in the first run's list
    after: int | None
    kind: MatchKind
    similarity: float | None = None
    code: tuple[str, ...] = ()  # an edited cell's changed lines


def normalized(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def match_cells(
    before: Sequence[str], after: Sequence[str], order_matters: bool = True
) -> list[Match]:
    """Pair the cells of two runs by their code. The result lists the second run's cells
    in order, each removed cell just before the first cell that followed it."""
    a = [normalized(c) for c in before]
    b = [normalized(c) for c in after]
    pairs = _exact(a, b)
    kept = _in_order(pairs) if order_matters else set(pairs)
    matches: dict[int, Match] = {}
    for i, j in pairs:
        matches[j] = Match(i, j, "same" if (i, j) in kept else "moved")
    left_a = [i for i in range(len(a)) if i not in {p[0] for p in pairs}]
    left_b = [j for j in range(len(b)) if j not in matches]
    for i, j, ratio in _similar(a, b, left_a, left_b):
        matches[j] = Match(i, j, "edited", round(ratio, 3), changed_lines(a[i], b[j]))
    used = {m.before for m in matches.values()}
    removed = [i for i in range(len(a)) if i not in used]
    out: list[Match] = []
    for j in range(len(b)):
        m = matches.get(j, Match(None, j, "added"))
        if m.before is not None:
            while removed and removed[0] < m.before:
                out.append(Match(removed.pop(0), None, "removed"))
        out.append(m)
    out += [Match(i, None, "removed") for i in removed]
    return out


def _exact(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    where: dict[str, list[int]] = {}
    for i, code in enumerate(a):
        where.setdefault(code, []).append(i)
    taken: dict[str, int] = {}
    pairs = []
    for j, code in enumerate(b):
        seen = where.get(code, [])
        k = taken.get(code, 0)
        if k < len(seen):
            pairs.append((seen[k], j))
            taken[code] = k + 1
    return pairs


def _in_order(pairs: Sequence[tuple[int, int]]) -> set[tuple[int, int]]:
    """The largest set of pairs whose first-run positions rise with their second-run ones
    (a longest increasing subsequence, pairs sorted by the second run)."""
    tails: list[int] = []  # tails[k]: smallest first-run position ending a run of k + 1
    ends: list[int] = []  # the pair index at tails[k]
    back: list[int] = [-1] * len(pairs)
    for n, (i, _) in enumerate(pairs):
        k = bisect.bisect_left(tails, i)
        if k == len(tails):
            tails.append(i)
            ends.append(n)
        else:
            tails[k] = i
            ends[k] = n
        back[n] = ends[k - 1] if k > 0 else -1
    keep: set[tuple[int, int]] = set()
    n = ends[-1] if ends else -1
    while n >= 0:
        keep.add(pairs[n])
        n = back[n]
    return keep


def similarity(x: str, y: str) -> float:
    if len(x) + len(y) > _CHARS:
        m = difflib.SequenceMatcher(None, x.splitlines(), y.splitlines(), autojunk=False)
    else:
        m = difflib.SequenceMatcher(None, x, y, autojunk=False)
    if m.real_quick_ratio() < SIMILAR or m.quick_ratio() < SIMILAR:
        return 0.0
    return m.ratio()


def _similar(
    a: Sequence[str], b: Sequence[str], left_a: Sequence[int], left_b: Sequence[int]
) -> list[tuple[int, int, float]]:
    """Pairs of similar cells: the most similar first, then the nearest in position."""
    candidates = []
    for i in left_a:
        for j in left_b:
            ratio = similarity(a[i], b[j])
            if ratio >= SIMILAR:
                candidates.append((-ratio, abs(i - j), i, j))
    candidates.sort()
    used_a: set[int] = set()
    used_b: set[int] = set()
    out = []
    for neg, _, i, j in candidates:
        if i in used_a or j in used_b:
            continue
        used_a.add(i)
        used_b.add(j)
        out.append((i, j, -neg))
    return out


def changed_lines(old: str, new: str, limit: int = CODE_LINES) -> tuple[str, ...]:
    """The lines an edit took out (``-``) and put in (``+``), the first ``limit`` of them."""
    lines = [
        line
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), n=0, lineterm="")
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    if len(lines) > limit:
        lines = [*lines[:limit], f"… {len(lines) - limit} more changed lines"]
    return tuple(lines)
