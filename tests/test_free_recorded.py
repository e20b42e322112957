"""``%gpumem free`` on recorded attribution (the replay kernel, the demo): the plan made by
the same analysis as live, from the references recorded on a GPU grouped by owner; a real
run plays it on the records, so later ``who`` readings lose the owners let go. Nothing is
measured: the report's measured figures stay None and a note says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_gpumem.analysis.free_plan import TRACEBACK, holder_kind, walks_from_references
from jupyter_gpumem.collectors.snapshot import Recording
from jupyter_gpumem.errors import ActionRefused
from jupyter_gpumem.model import AllocatorSnapshot, Reference
from jupyter_gpumem.reporters.free import free_lines
from jupyter_gpumem.testing.recorded_free import REPLAYED, RecordedFrees
from jupyter_gpumem.testing.replay import RecordedAttribution, env
from tests.conftest import run
from tests.fakes import FIXTURES

ATTRIBUTION = Path(__file__).parent.parent / "jupyter_gpumem/testing/recorded/attribution.json"
MiB = 1 << 20


def owners(source: RecordedAttribution) -> dict[str, int]:
    """Bytes by owner in the source's ``who`` reading (one device)."""
    (held,) = source.holdings(Recording(), None, True, None).values()
    out: dict[str, int] = {}
    for r in held.report("variable", None).rows:
        if r.kind == "owner":
            out[r.key] = out.get(r.key, 0) + r.bytes
    return out


@pytest.mark.parametrize(
    ("owner", "kind"),
    [
        ("model", "name"),
        ("Out[7]", "output"),
        ("_", "output"),
        ("__", "output"),
        ("_12", "output"),
        ("_private", "name"),
        ("traceback: f() at In[3] line 2: x", "traceback"),
        (TRACEBACK, "traceback"),
    ],
)
def test_a_recorded_owner_s_kind_is_read_from_its_spelling(owner, kind):
    assert holder_kind(owner) == kind


def test_the_kept_traceback_s_frames_are_one_place():
    refs = [
        Reference(0, 1, 8, "traceback: f() at In[3] line 2: x", "traceback", "x", 3),
        Reference(0, 2, 8, "traceback: g() at In[3] line 5: y", "traceback", "y", 4),
        Reference(0, 3, 8, "total", "tensor", "total", 1),
    ]
    walks = walks_from_references(refs)
    assert [(w.owner, w.kind, len(w.refs)) for w in walks] == [
        (TRACEBACK, "traceback", 2),
        ("total", "name", 1),
    ]
    assert walks[1].is_tensor and not walks[0].is_tensor


def _segment(address: int, *blocks: tuple[int, int, str]) -> dict:
    return {
        "device": 0,
        "address": address,
        "total_size": sum(size for _, size, _ in blocks),
        "blocks": [
            {"address": a, "size": size, "requested_size": size, "state": state, "frames": []}
            for a, size, state in blocks
        ],
    }


def test_a_detached_tensor_keeps_its_value_and_loses_its_graph():
    # GIVEN loss (a tensor whose graph saved acts) and acts, each in a segment of its own
    snap = AllocatorSnapshot(
        0.0,
        [
            _segment(1000, (1000, 4 * MiB, "active_allocated")),
            _segment(9000, (9000, 512, "active_allocated")),
        ],
        False,
    )
    record = {
        "refs": [
            [0, 1000, 4 * MiB, "acts", "tensor", "acts", 1],
            [0, 9000, 4, "loss", "tensor", "loss", 2],
            [0, 1000, 4 * MiB, "loss", "autograd graph", "loss.grad_fn._saved_self", 2],
        ]
    }
    frees = RecordedFrees()
    # WHEN acts is freed
    report = frees.free(record, snap, ["acts"], dry=False)
    # THEN loss drops its graph in place and keeps its own storage; acts' segment goes back
    assert [(g.holder, g.action) for g in report.let_go] == [
        ("acts", "delete"),
        ("loss", "detach"),
    ]
    assert report.devices[0].expected_returned == 4 * MiB
    left = frees.references(record["refs"])
    assert [(r.owner, r.via) for r in left] == [("loss", "tensor")]
    after = frees.snapshot(snap)
    assert [s["address"] for s in after.segments] == [9000]


def test_a_dry_run_changes_nothing_and_a_real_one_plays_the_plan():
    source = RecordedAttribution(str(ATTRIBUTION))
    before = owners(source)
    assert before["base"] == 64 * MiB and before["a"] == 3 * MiB
    # GIVEN a preview of freeing base
    dry = source.free(["base"], dry=True)
    assert not dry.done and [g.code for g in dry.let_go] == ["del base", "del view"]
    assert dry.held == 64 * MiB and dry.expected_returned == 64 * MiB
    assert owners(source) == before  # a dry run lets go of nothing
    # WHEN it is freed
    done = source.free(["base"], dry=False)
    # THEN the same plan, done, nothing measured, said so
    assert done.done and done.let_go == dry.let_go and done.notes == (REPLAYED,)
    assert [(d.freed, d.returned, d.still_held) for d in done.devices] == [(None, None, None)]
    assert "  cuda:0: nothing was measured" in free_lines(done)
    # AND who lost base and its 64 MiB; the other owners are as they were
    assert owners(source) == {k: v for k, v in before.items() if k != "base"}
    (held,) = source.holdings(Recording(), None, True, None).values()
    assert held.report("variable", None).allocated == 217111552 - 64 * MiB


def test_names_are_refused_as_live():
    source = RecordedAttribution(str(ATTRIBUTION))
    with pytest.raises(ActionRefused) as e:
        source.free(["modl"], dry=True)
    assert str(e.value) == (
        "'modl' is not a variable of this kernel (did you mean model?): "
        "name a variable, Out[N] or _"
    )
    source.free(["a"], dry=False)
    with pytest.raises(ActionRefused, match="'a' is not a variable of this kernel"):
        source.free(["a"], dry=True)


def test_the_post_mortem_s_names_are_planned_on_the_failure_s_record():
    # GIVEN the recorded OOM, whose fix deletes `blocks` (a name of that moment only)
    source = RecordedAttribution(str(ATTRIBUTION))
    (pm,) = source.known_postmortems()
    fix = next(f for f in pm.fixes if f.free_names)
    assert (fix.command, fix.free_names) == ("del blocks", ("blocks",))
    # WHEN it is previewed
    report = source.free(list(fix.free_names), dry=True)
    # THEN the plan frees the 512 MiB the fix says, and who's record is untouched
    assert report.held == fix.frees == 512 * MiB
    assert [g.code for g in report.let_go] == ["del blocks"]


def test_the_magic_frees_on_the_replay_kernel(shell, monkeypatch):
    # GIVEN a kernel that replays the readings and the attribution recorded on a GPU
    for k, v in env(str(FIXTURES)).items():
        monkeypatch.setenv(k, v)
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    try:
        # WHEN the user previews, then frees, an output history entry
        result, (preview,), _ = run(shell, "%gpumem free --dry Out[7]")
        assert result.success
        # THEN the recorded plan: Out[7] and its alias _ are forgotten
        assert "    Out.pop(7)  the name you gave (4.00 MiB)" in preview.splitlines()
        assert "    _ = None    output history: it shows Out[7] (4.00 MiB)" in preview
        assert "dry run: nothing was let go" in preview
        result, (done,), _ = run(shell, "%gpumem free Out[7]")
        assert "cuda:0: nothing was measured" in done and "replayed on recorded data" in done
        # AND the output history is gone from who
        _, texts, _ = run(shell, "%gpumem who")
        assert "Out[7]" not in "".join(texts) and "base" in "".join(texts)
    finally:
        shell.run_line_magic("unload_ext", "jupyter_gpumem")
