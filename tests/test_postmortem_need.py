"""An out-of-memory error's fixes judged against what the cell needs (analysis/postmortem.py,
analysis/scan_hint.py), on plain records: the numbers are chosen so that each verdict is
known in advance."""

from __future__ import annotations

from jupyter_gpumem.analysis.postmortem import (
    Need,
    bound_names,
    explain_oom,
    size_variables,
)
from jupyter_gpumem.analysis.scan_hint import scan_knowledge, size_arg
from jupyter_gpumem.analysis.sites import SiteResolver
from jupyter_gpumem.analysis.who import DeviceHoldings
from jupyter_gpumem.model import (
    AllocatorStats,
    DeviceSample,
    Fit,
    OomEvent,
    Reference,
    ScanResult,
    ScanRun,
    Target,
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
CAP = 12 * GiB


class NoCells:
    def execution_count(self, filename):
        return None

    def line_text(self, filename, line):
        return ""

    def files_of(self, count):
        return frozenset()


def situation(owners: dict[str, tuple[str, int]]):
    """A device capped at 12 GiB, full: one segment per owner's block, nothing cached.
    ``owners``: name -> (via, bytes)."""
    segments, refs, blocks = [], [], {}
    address = 1 << 32
    for order, (name, (via, size)) in enumerate(owners.items()):
        block = {
            "address": address,
            "size": size,
            "requested_size": size,
            "state": "active_allocated",
            "frames": [],
        }
        segments.append(
            {
                "device": 0,
                "address": address,
                "total_size": size,
                "allocated_size": size,
                "blocks": [block],
            }
        )
        blocks[address] = block
        refs.append(Reference(0, address, size, name, via, name, order))
        address += size
    allocated = sum(s["total_size"] for s in segments)
    held = DeviceHoldings(
        0, False, blocks, {r.address: r for r in refs}, 0, SiteResolver(NoCells())
    )
    stats = AllocatorStats(
        allocated,
        allocated,
        allocated,
        allocated,
        0,
        allocated,
        allocated,
        0,
        0,
        0,
        1,
        len(segments),
        len(segments),
    )
    total = 80 * GiB
    after = DeviceSample(0, "gpu", "cuda", True, stats, total, total - 60 * GiB, None)
    return segments, held, after


def fix(pm, command):
    return next(f for f in pm.fixes if f.command == command)


# The GPT-2 case of the issue, in round numbers: weights and optimizer state from earlier
# cells, 9.25 GiB of this run's activations still held by the kept traceback, and a
# failed request of 96 MiB, under a 12 GiB cap.
OWNERS = {
    "model": ("parameters", 512 * MiB),
    "gopt": ("optimizer state", 1 * GiB),
    "traceback: forward() at In[7] line 3: h": ("traceback", 9 * GiB + 256 * MiB),
    "out": ("tensor", 1 * GiB),  # bound by the failed cell, from its previous run
}
EVENT = OomEvent(0, 96 * MiB, CAP, 20 * GiB)


def test_memory_of_the_failed_run_is_a_first_step_not_a_fix():
    segments, held, after = situation(OWNERS)
    need = Need(so_far=9 * GiB + 256 * MiB + 96 * MiB, bound=bound_names("out = model(x)"))
    pm = explain_oom(EVENT, after, segments, held, need=need)
    first = [f for f in pm.fixes if f.first_step]
    assert [f.command for f in first] == ["%gpumem release-traceback", "del out"]
    assert list(pm.fixes[: len(first)]) == first  # before any fix
    assert first[0].frees == 9 * GiB + 256 * MiB and first[0].fits is None
    assert "first, before any retry" in first[0].text
    # after them: 12 GiB cap, 1.5 GiB still held (model, gopt): 10.5 GiB of room
    assert pm.room == CAP - (512 * MiB + 1 * GiB)
    assert pm.need == 9 * GiB + 352 * MiB


MAYBE = "maybe: it may need more after the point where it failed"


def test_a_fix_that_covers_the_need_so_far_is_maybe_and_one_that_does_not_is_no():
    segments, held, after = situation(OWNERS)
    # the cell needed 11 GiB so far: after the first steps 10.5 GiB is free for it
    need = Need(so_far=11 * GiB, bound=frozenset({"out"}))
    pm = explain_oom(EVENT, after, segments, held, need=need)
    gopt = fix(pm, "del gopt")  # frees 1 GiB: the 0.5 GiB short is covered, so far
    assert gopt.fits is None and gopt.text == (
        "`del gopt` frees 1.00 GiB: covers the 512.00 MiB still missing after the first "
        f"steps (of the 11.00 GiB the cell needed so far; {MAYBE})"
    )
    model = fix(pm, "del model")  # frees 0.5 GiB: exactly the shortfall
    assert model.fits is None
    need = Need(so_far=12 * GiB, bound=frozenset({"out"}))
    pm = explain_oom(EVENT, after, segments, held, need=need)
    model = fix(pm, "del model")
    assert model.fits is False and model.shortfall == 1 * GiB
    assert model.text.endswith("and this would leave it 1.00 GiB short")
    assert all(f.fits is not True for f in pm.fixes)  # nothing fits without the whole need


def test_with_the_whole_need_known_a_fix_fits_or_not():
    segments, held, after = situation(OWNERS)
    whole = Need(so_far=9 * GiB, full=11 * GiB + 256 * MiB, bound=frozenset({"out"}))
    pm = explain_oom(EVENT, after, segments, held, need=whole)
    assert fix(pm, "del gopt").fits is True  # 10.5 + 1 >= 11.25
    assert fix(pm, "del gopt").text == (
        "`del gopt` frees 1.00 GiB: enough for the whole cell: covers the 768.00 MiB still "
        "missing after the first steps (it needs 11.25 GiB)"
    )
    assert fix(pm, "del model").fits is False  # 10.5 + 0.5 < 11.25
    assert fix(pm, "del model").shortfall == 256 * MiB
    assert fix(pm, "del model").text == (
        "`del model` frees 512.00 MiB: not enough, 768.00 MiB of the 11.25 GiB the whole cell "
        "needs is still missing after the first steps and this would leave it 256.00 MiB short"
    )
    # the ones that fit come first: lifting the cap the user set, then deleting their data
    assert [f.command for f in pm.fixes if f.fits is True] == ["%gpumem limit off", "del gopt"]
    bigger = Need(so_far=9 * GiB, full=13 * GiB, bound=frozenset({"out"}))
    pm = explain_oom(EVENT, after, segments, held, need=bigger)
    gopt = fix(pm, "del gopt")
    assert gopt.fits is False and gopt.shortfall == 13 * GiB - 10 * GiB - 512 * MiB - 1 * GiB
    # lifting the cap moves the limit: 60 GiB free on the device
    assert fix(pm, "%gpumem limit off").fits is True


def test_when_the_first_steps_alone_make_room_later_fixes_are_not_needed():
    # The case: after releasing the traceback and `del out` the 9.34 GiB the cell
    # needed so far fits; `del ids` (64 KiB) must not read "covers the 9.34 GiB".
    segments, held, after = situation({**OWNERS, "ids": ("tensor", 64 * KiB)})
    need = Need(so_far=9 * GiB + 256 * MiB + 96 * MiB, bound=frozenset({"out"}))
    pm = explain_oom(EVENT, after, segments, held, need=need)
    assert pm.room is not None and pm.need is not None and pm.room >= pm.need
    first = [f for f in pm.fixes if f.first_step]
    assert [f.command for f in first] == ["%gpumem release-traceback", "del out"]
    assert first[-1].text == (
        "first, before any retry: `del out` frees 1.00 GiB that the failed cell bound "
        "(re-running it allocates them again while these are still held); the first steps "
        "alone make room for the 9.34 GiB the cell needed so far: re-run after them"
    )
    assert "make room" not in first[0].text  # said once, after the last of them
    not_needed = (
        ": not needed once the first steps are done (they make room for the 9.34 GiB the cell "
        "needed so far); extra room if it needs more after the point where it failed"
    )
    ids = fix(pm, "del ids")
    assert ids.text == "`del ids` frees 64.00 KiB" + not_needed
    assert ids.fits is None and ids.shortfall is None
    assert fix(pm, "%gpumem limit off").text.endswith(not_needed)
    assert not any("covers" in f.text for f in pm.fixes)
    # the ordering rules hold: first steps, then by verdict, priority and bytes freed
    assert [f.command for f in pm.fixes] == [
        "%gpumem release-traceback",
        "del out",
        "%gpumem limit off",
        "del gopt",
        "del model",
        "del ids",
        "%gpumem empty-cache",
        "",
    ]


def test_with_the_whole_need_known_the_first_steps_alone_may_make_room_for_it():
    segments, held, after = situation(OWNERS)
    whole = Need(so_far=9 * GiB, full=10 * GiB, bound=frozenset({"out"}))  # room: 10.5 GiB
    pm = explain_oom(EVENT, after, segments, held, need=whole)
    assert fix(pm, "del out").text.endswith(
        "; the first steps alone make room for the 10.00 GiB the whole cell needs: re-run "
        "after them"
    )
    gopt = fix(pm, "del gopt")
    assert gopt.fits is True and gopt.text == (
        "`del gopt` frees 1.00 GiB: not needed once the first steps are done (they make room "
        "for the 10.00 GiB the whole cell needs); extra room"
    )


def test_a_later_fix_is_judged_against_what_the_first_steps_leave_missing():
    segments, held, after = situation(OWNERS)
    need = Need(so_far=12 * GiB, bound=frozenset({"out"}))
    pm = explain_oom(EVENT, after, segments, held, need=need)
    # the module's definitions: free now is what PyTorch may still take under the cap
    # (nothing is cached); the first steps free the traceback's 9.25 GiB and `out`'s 1 GiB
    allocated = sum(s["total_size"] for s in segments)
    free_now = CAP - allocated
    first = sum(f.frees or 0 for f in pm.fixes if f.first_step)
    assert (allocated, free_now, first) == (11 * GiB + 768 * MiB, 256 * MiB, 10 * GiB + 256 * MiB)
    remainder = need.so_far - first - free_now
    assert remainder == 1 * GiB + 512 * MiB == pm.need - pm.room
    assert fix(pm, "del out").text.endswith(
        "; after the first steps 1.50 GiB of the 12.00 GiB the cell needed so far is still "
        "missing: the fixes below are judged against that"
    )
    gopt = fix(pm, "del gopt")
    assert gopt.fits is False and gopt.shortfall == remainder - 1 * GiB == 512 * MiB
    assert gopt.text == (
        "`del gopt` frees 1.00 GiB: not enough, 1.50 GiB of the 12.00 GiB the cell needed so "
        "far is still missing after the first steps and this would leave it 512.00 MiB short"
    )
    model = fix(pm, "del model")
    assert model.fits is False and model.shortfall == remainder - 512 * MiB
    # lifting the cap adds 60 GiB of device memory: it covers the remainder, so far
    cap = fix(pm, "%gpumem limit off")
    assert cap.fits is None and cap.text.endswith(
        ": covers the 1.50 GiB still missing after the first steps (of the 12.00 GiB the "
        f"cell needed so far; {MAYBE})"
    )


def test_when_the_first_steps_make_room_but_no_block_for_the_request_the_line_says_so():
    # one segment: the traceback's two 1 GiB blocks around the model's 512 MiB, at a cap
    # of 2.5 GiB; after the first steps 2 GiB is free, in two runs of 1 GiB
    sizes = [("traceback: f() at In[3] line 2: a", GiB), ("model", 512 * MiB)]
    sizes.append(("traceback: f() at In[3] line 3: b", GiB))
    address, blocks, refs = 1 << 32, [], {}
    for order, (name, size) in enumerate(sizes):
        blocks.append(
            {
                "address": address,
                "size": size,
                "requested_size": size,
                "state": "active_allocated",
                "frames": [],
            }
        )
        via = "traceback" if name.startswith("traceback:") else "parameters"
        refs[address] = Reference(0, address, size, name, via, name, order)
        address += size
    total = sum(size for _, size in sizes)
    segment = {"device": 0, "address": 1 << 32, "total_size": total, "allocated_size": total}
    held = DeviceHoldings(
        0, False, {b["address"]: b for b in blocks}, refs, 0, SiteResolver(NoCells())
    )
    after = DeviceSample(0, "gpu", "cuda", True, None, 80 * GiB, 20 * GiB, None)
    event = OomEvent(0, 1536 * MiB, total, 60 * GiB)
    pm = explain_oom(event, after, [{**segment, "blocks": blocks}], held, need=Need(1536 * MiB))
    release = fix(pm, "%gpumem release-traceback")
    assert release.text.endswith(
        "; after the first steps there is room for the 1.50 GiB the cell needed so far, but "
        "the 1.50 GiB request still fits in no free block (fragmentation)"
    )
    # lifting the cap lets the request have a segment of its own
    assert fix(pm, "%gpumem limit off").fits is None


def test_memory_nobody_can_reach_is_judged_against_the_remainder_too():
    segments, held, after = situation({**OWNERS, "lost": ("tensor", 1 * GiB)})
    lost = next(a for a, r in held.owners.items() if r.owner == "lost")
    del held.owners[lost]  # a live block no name leads to
    pm = explain_oom(
        EVENT, after, segments, held, need=Need(so_far=10 * GiB, bound=frozenset({"out"}))
    )
    # room: the cap less model, gopt and the lost block (2.5 GiB): 9.5 GiB of 10 GiB
    unreachable = next(f for f in pm.fixes if "not reachable" in f.text)
    assert unreachable.text == (
        "1.00 GiB is not reachable from the namespace (held by objects this walk does not "
        "open, or kept by C++): finding and freeing it would cover the 512.00 MiB still "
        "missing after the first steps"
    )


def test_without_first_steps_the_words_are_against_the_need_itself():
    owners = {
        "model": ("parameters", 512 * MiB),
        "gopt": ("optimizer state", 1 * GiB),
        "acts": ("tensor", 10 * GiB),
    }
    segments, held, after = situation(owners)  # 11.5 GiB held: 512 MiB left under the cap
    pm = explain_oom(EVENT, after, segments, held, need=Need(so_far=1 * GiB))
    assert not any(f.first_step for f in pm.fixes)
    assert fix(pm, "del acts").text == (
        f"`del acts` frees 10.00 GiB: covers the 1.00 GiB the cell needed so far ({MAYBE})"
    )
    pm = explain_oom(EVENT, after, segments, held, need=Need(so_far=2 * GiB))
    assert fix(pm, "del model").text == (
        "`del model` frees 512.00 MiB: not enough, the cell needs 2.00 GiB and would still "
        "be 1.00 GiB short"
    )
    # nothing missing: the need fits in what PyTorch can still take here
    pm = explain_oom(EVENT, after, segments, held, need=Need(so_far=256 * MiB))
    assert fix(pm, "del acts").text == (
        "`del acts` frees 10.00 GiB: not needed, there is room for the 256.00 MiB the cell "
        "needed so far already; extra room if it needs more after the point where it failed"
    )


def test_the_names_a_cell_binds():
    code = "out = model(x)\nfor step in range(3):\n    loss = out.sum()\nwith ctx() as c, d:\n    pass\na, (b, *c2) = 1, (2, 3)\ny += 1\n"  # noqa: E501
    assert bound_names(code) == frozenset({"out", "step", "c", "a", "b", "c2", "y"})
    assert bound_names("this is not python") == frozenset()


def test_obvious_size_variables_and_the_scan_to_run():
    code = "batch = 64\nx = torch.randn(batch, seq_len)\n"
    found = size_variables(code, {"seq_len": 1024, "other": 5})
    assert sorted(found) == [("batch", 64, True), ("seq_len", 1024, False)]
    full, hint = scan_knowledge(code, 0, {"seq_len": 1024}, [], 12 * GiB)
    assert full is None
    assert hint.startswith("`%%gpumem --scan batch=16,32,48 --fit-in 12GiB` on this cell")
    assert "(move `batch = 64` out of it first)" in hint
    assert hint.endswith(
        "(--fit-in is a card's whole memory, from which the scan takes what this process "
        "holds outside PyTorch, unknown here: add it to the current cap of 12.00 GiB)"
    )
    # known: the card is the cap plus it, so that the scan's budget is the cap
    _, hint = scan_knowledge(code, 0, {}, [], 12 * GiB, outside=500 * MiB)
    assert hint.startswith("`%%gpumem --scan batch=16,32,48 --fit-in 12788MiB` on this cell")
    assert hint.endswith("the current cap of 12.00 GiB plus the 500.00 MiB held outside it here)")
    # no cap: the scan's default target (what this GPU has free now) needs no --fit-in
    _, hint = scan_knowledge(code, 0, {}, [], None, outside=500 * MiB)
    assert hint.startswith("`%%gpumem --scan batch=16,32,48` on this cell (move")
    assert size_arg(12 * GiB) == "12GiB" and size_arg(1500 * MiB + 7) == "1500MiB"


def scan_result(**kw) -> ScanResult:
    fit = Fit("affine", 1 * GiB, 100 * MiB, 0.0, (8.0, 16.0), (1.8 * GiB, 2.6 * GiB), (0, 0))
    probe = ScanRun(8, "probe", True, None, False, 1 * GiB, 2 * GiB, 2 * GiB, 0, None, 0.1)
    fields = {
        "name": "batch",
        "device": 0,
        "runs": (probe,),
        "target": Target(CAP, "12 GiB", "t", True),
        "outside_torch": 0,
        "cap": CAP,
        "margin": 0,
        "budget": CAP,
        "fit": fit,
        "predicted": 112.0,
        "verified": 110.0,
        "verify_note": "",
        "answer": "",
        "integer": True,
        "execution_count": 5,
    }
    fields.update(kw)
    return ScanResult(**fields)  # type: ignore[arg-type]


def test_a_scan_of_the_cell_gives_the_whole_need_and_the_answer():
    full, hint = scan_knowledge(
        "x = torch.randn(batch, 10)", 0, {"batch": 64}, [scan_result()], CAP
    )
    assert full == 100 * MiB * 64  # the fit at 64, above the probes' start
    assert hint.startswith("`batch` = 64 needs about 6.25 GiB (the fit of the scan of In[5])")
    assert "110 fits in 12 GiB (verified)" in hint
    # a cap other than the scan's: the fit's prediction for it
    full, hint = scan_knowledge("f(batch)", 0, {"batch": 64}, [scan_result()], 6 * GiB)
    assert "under the current cap of 6.00 GiB its fit predicts 51 (not verified)" in hint
    # a cell that does not read the scanned name learns nothing from it
    assert scan_knowledge("f(n)", 0, {"batch": 64}, [scan_result()], CAP) == (None, "")


def verify_run(value: float, ok: bool) -> ScanRun:
    return ScanRun(
        value=value,
        kind="verify",
        ok=ok,
        error=None if ok else "OutOfMemoryError: CUDA out of memory",
        oom=not ok,
        base=1 * GiB,
        peak_allocated=10 * GiB,
        peak_reserved=10 * GiB,
        kept=0,
        cap=CAP,
        wall_time=0.1,
    )


def test_a_scan_whose_verification_failed_is_never_called_a_fit():
    # The H100 recording (oom_need_after_scan) said "779 fits in 2.69 GiB (predicted)" of a
    # scan whose verification ran out of memory at 779 and below.
    from jupyter_gpumem.analysis.scan_predict import answer as _answer

    failed = scan_result(
        runs=(scan_result().runs[0], verify_run(779, False), verify_run(700, False)),
        predicted=779.0,
        verified=None,
    )
    assert failed.verify_failed and failed.largest is None and failed.smallest_failed == 700
    answer = _answer(failed, True)
    assert answer == (
        "no batch found that fits in 12 GiB: every value tried ran out of memory under the "
        "12.00 GiB cap, down to 700 (the prediction was 779); scan smaller values, e.g. "
        "--scan batch=87,175,350"
    )
    full, hint = scan_knowledge("f(batch)", 0, {"batch": 64}, [failed], 6 * GiB)
    assert full == 100 * MiB * 64
    assert "fits in 12 GiB (" not in hint and "779 fits" not in hint
    assert "its fit predicts" not in hint  # the fit is known to promise too much
    assert hint.endswith(
        "; it found no batch that fits in 12 GiB: every value tried ran out of memory under "
        "its cap, down to 700; scan smaller values: `%%gpumem --scan batch=87,175,350`"
    )
    # a verification that ran: the answer is what ran, not the prediction
    stepped = scan_result(
        runs=(scan_result().runs[0], verify_run(779, False), verify_run(700, True)),
        predicted=779.0,
        verified=700.0,
    )
    assert not stepped.verify_failed and stepped.largest == 700
    assert _answer(stepped, True) == (
        "largest batch that fits in 12 GiB: 700 (verified; predicted 779)"
    )
    hint = scan_knowledge("f(batch)", 0, {"batch": 64}, [stepped], CAP)[1]
    assert "700 fits in 12 GiB (verified)" in hint
    # not verified (--no-verify): the prediction, said to be one
    plain = scan_result(verified=None, predicted=112.0)
    assert not plain.verify_failed and plain.largest == 112
    hint = scan_knowledge("f(batch)", 0, {"batch": 64}, [plain], CAP)[1]
    assert "112 fits in 12 GiB (predicted)" in hint
