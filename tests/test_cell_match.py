"""Which cell of one run is which cell of another (analysis/cell_match.py): by code, not by
place; moved, edited, added and removed cells named as such."""

from __future__ import annotations

import pytest

from jupyter_gpumem.analysis.cell_match import (
    CODE_LINES,
    SIMILAR,
    changed_lines,
    match_cells,
    similarity,
)


def kinds(before, after, order_matters=True):
    return [(m.before, m.after, m.kind) for m in match_cells(before, after, order_matters)]


def test_the_same_notebook_matches_cell_for_cell():
    cells = ["import torch", "x = f(32)", "y = g(x)"]
    assert kinds(cells, list(cells)) == [(0, 0, "same"), (1, 1, "same"), (2, 2, "same")]


def test_trailing_spaces_and_blank_lines_do_not_make_another_cell():
    assert kinds(["x = 1  \n\n", "\ny = 2"], ["x = 1", "y = 2\n"]) == [
        (0, 0, "same"),
        (1, 1, "same"),
    ]


def test_an_inserted_cell_is_added_and_the_others_keep_their_match():
    # GIVEN a cell inserted at the top: every other cell's position shifts by one
    before = ["a = 1", "b = 2", "c = 3"]
    after = ["setup()", "a = 1", "b = 2", "c = 3"]
    # THEN the shifted cells are still the same cells, not moved
    assert kinds(before, after) == [
        (None, 0, "added"),
        (0, 1, "same"),
        (1, 2, "same"),
        (2, 3, "same"),
    ]


def test_a_moved_cell_is_the_one_out_of_order():
    before = ["a = 1", "b = 2", "c = 3", "d = 4"]
    after = ["a = 1", "c = 3", "d = 4", "b = 2"]
    got = kinds(before, after)
    assert got == [(0, 0, "same"), (2, 1, "same"), (3, 2, "same"), (1, 3, "moved")]
    # in a session, the order cells ran in says nothing: no cell is "moved"
    assert {k for _, _, k in kinds(before, after, order_matters=False)} == {"same"}


def test_an_edited_cell_matches_by_similarity_and_says_what_changed():
    before = ["import torch", "x = model(batch_size=32)", "print(x)"]
    after = ["import torch", "x = model(batch_size=64)", "print(x)"]
    ms = match_cells(before, after)
    edited = ms[1]
    assert (edited.before, edited.after, edited.kind) == (1, 1, "edited")
    assert SIMILAR <= edited.similarity < 1
    assert edited.code == ("-x = model(batch_size=32)", "+x = model(batch_size=64)")


def test_a_removed_cell_comes_where_it_was():
    before = ["a = 1", "drop_me_entirely()", "c = 3"]
    after = ["a = 1", "c = 3"]
    assert kinds(before, after) == [(0, 0, "same"), (1, None, "removed"), (2, 1, "same")]


def test_unrelated_code_is_removed_and_added_not_edited():
    before = ["a = 1", "model = build_transformer(layers=12)"]
    after = ["a = 1", "plt.plot(losses)"]
    assert similarity(before[1], after[1]) < SIMILAR
    assert kinds(before, after) == [(0, 0, "same"), (None, 1, "added"), (1, None, "removed")]


def test_repeated_code_pairs_up_in_order():
    before = ["step()", "x = 1", "step()"]
    after = ["step()", "step()", "x = 1"]
    got = kinds(before, after)
    # the first step() with the first, the second with the second; one of the two cells
    # that swapped places moved
    assert {(b, a) for b, a, _ in got} == {(0, 0), (2, 1), (1, 2)}
    assert [k for _, _, k in got].count("moved") == 1


def test_of_two_similar_candidates_the_most_similar_then_the_nearest_wins():
    before = ["x = torch.zeros(10)", "x = torch.zeros(2000)"]
    after = ["x = torch.zeros(2001)"]
    assert similarity(before[1], after[0]) > similarity(before[0], after[0]) >= SIMILAR
    assert kinds(before, after) == [(0, None, "removed"), (1, 0, "edited")]
    # equally similar: the nearer one
    before = ["x = f(10)", "a = 1", "b = 2", "x = f(20)"]
    after = ["a = 1", "b = 2", "x = f(21)"]
    assert similarity(before[0], after[2]) == similarity(before[3], after[2])
    edited = [m for m in match_cells(before, after) if m.kind == "edited"]
    assert [(m.before, m.after) for m in edited] == [(3, 2)]


@pytest.mark.parametrize("size", [10, 30_000])
def test_long_cells_compare(size):
    # a long cell (past the character comparison's budget) compares by lines
    body = "\n".join(f"layer_{i} = make({i})" for i in range(size // 20))
    edited = body.replace("layer_3 = make(3)", "layer_3 = make(4)")
    if size > 1000:
        assert len(body) > 20_000
    m = match_cells([body], [edited])[0]
    assert m.kind == ("edited" if edited != body else "same")


def test_changed_lines_are_capped():
    old = "\n".join(f"a{i} = {i}" for i in range(20))
    new = "\n".join(f"a{i} = {i + 1}" for i in range(20))
    lines = changed_lines(old, new)
    assert len(lines) == CODE_LINES + 1
    assert lines[-1] == f"… {40 - CODE_LINES} more changed lines"
    assert lines[0] == "-a0 = 0"
