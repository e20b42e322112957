"""``%gpumem free``'s plan on plain records (analysis/free_plan.py): what each holder's walk
reaches decides whether it is let go, detached or left alone; the expected bytes follow
from the blocks no remaining holder reaches and the segments that then hold nothing live."""

from __future__ import annotations

from jupyter_gpumem.analysis.free_plan import HolderWalk, plan
from jupyter_gpumem.model import AllocatorSnapshot, Reference

MiB = 1 << 20
A, B, S1, S2, L, G1, X, H = (0x1000 * (i + 1) for i in range(8))
SIZE = {
    A: 64 * MiB,
    B: 32 * MiB,
    S1: 64 * MiB,
    S2: 32 * MiB,
    L: 512,
    G1: 8 * MiB,
    X: 4 * MiB,
    H: 16 * MiB,
}


def ref(owner, address, via="parameters", path=None, device=0):
    return Reference(device, address, SIZE[address], owner, via, path or f"{owner}.p", 0)


def model(owner="model"):
    return HolderWalk(owner, "name", (ref(owner, A), ref(owner, B)), type_name="Sequential")


def by_holder(report):
    return {g.holder: g for g in report.let_go}


def test_aliases_parts_and_output_history_are_let_go_and_everything_comes_back():
    holders = [
        model(),
        HolderWalk("m2", "name", (ref("m2", A), ref("m2", B)), same_as="model"),
        HolderWalk("w", "name", (ref("w", A, "tensor", "w"),), is_tensor=True),
        HolderWalk("Out[3]", "output", (ref("Out[3]", A), ref("Out[3]", B))),
        HolderWalk("_", "output", (ref("_", A), ref("_", B))),
        HolderWalk("keep", "name", (ref("keep", X, "tensor", "keep"),), is_tensor=True),
    ]
    report, freed = plan(["model"], holders)
    got = by_holder(report)
    assert got["model"].action == "delete" and got["model"].code == "del model"
    assert got["m2"].why == "another name for model"
    assert got["w"].action == "delete" and got["w"].why == "a part of model"
    assert got["Out[3]"].action == "forget" and got["Out[3]"].code == "Out.pop(3)"
    assert got["_"].action == "forget"
    assert "keep" not in got and not report.kept
    assert freed == {(0, A), (0, B)}
    (d,) = report.devices
    assert d.held == d.expected_freed == SIZE[A] + SIZE[B]


def test_an_optimizer_over_its_parameters_goes_with_its_state():
    opt = HolderWalk(
        "opt",
        "name",
        (
            ref("opt", A, "optimizer params"),
            ref("opt", B, "optimizer params"),
            ref("opt", S1, "optimizer state"),
            ref("opt", S2, "optimizer state"),
        ),
        type_name="AdamW",
    )
    report, freed = plan(["model"], [model(), opt])
    g = by_holder(report)["opt"]
    assert g.action == "delete" and g.why.startswith("the optimizer of model")
    assert freed == {(0, A), (0, B), (0, S1), (0, S2)}
    assert report.devices[0].expected_freed == sum(SIZE[k] for k in (A, B, S1, S2))
    assert report.devices[0].held == SIZE[A] + SIZE[B]  # the model's own bytes


def test_a_tensor_whose_graph_reaches_the_model_keeps_its_value_and_drops_its_graph():
    loss = HolderWalk(
        "total_loss",
        "name",
        (
            ref("total_loss", L, "tensor", "total_loss"),
            ref("total_loss", G1, "autograd graph", "total_loss.grad_fn…MmBackward0._saved_self"),
            ref("total_loss", A, "autograd graph", "total_loss.grad_fn…leaf"),
        ),
        is_tensor=True,
    )
    report, freed = plan(["model"], [model(), loss])
    g = by_holder(report)["total_loss"]
    assert g.action == "detach" and g.code == "total_loss.detach_()"
    assert (0, G1) in freed and (0, L) not in freed  # its value stays


def test_a_holder_with_other_data_is_left_alone_and_named_with_the_line_that_frees_it():
    results = HolderWalk(
        "results",
        "name",
        (
            ref("results", A, "container", "results['model'].0.weight"),
            ref("results", B, "container", "results['model'].0.bias"),
            ref("results", X, "container", "results['other']"),
        ),
        type_name="dict",
    )
    report, freed = plan(["model"], [model(), results])
    assert "results" not in by_holder(report)
    (k,) = report.kept
    assert k.holder == "results" and k.bytes == SIZE[A] + SIZE[B]
    assert k.example == "results['model'].0.weight" and k.fix == "del results['model']"
    assert "4.00 MiB of other GPU memory" in k.why
    assert freed == set()  # results still reaches every block of the model
    assert report.devices[0].expected_freed == 0


def test_the_kept_traceback_is_released_with_the_activations_it_holds():
    tb = HolderWalk(
        "the kept traceback",
        "traceback",
        (ref("tb", A, "traceback"), ref("tb", H, "traceback", "traceback: f(): h")),
    )
    report, freed = plan(["model"], [model(), tb])
    assert by_holder(report)["the kept traceback"].action == "release"
    assert freed == {(0, A), (0, B), (0, H)}


def test_a_block_another_name_reaches_is_not_expected_back():
    shared = HolderWalk("bias", "name", (ref("bias", B, "tensor", "bias"), ref("bias", X)))
    report, freed = plan(["model"], [model(), shared])
    assert freed == {(0, A)}
    assert report.kept[0].holder == "bias"


def test_expected_back_to_the_driver_counts_whole_segments_and_the_free_cache():
    def block(address, size, state="active_allocated"):
        return {
            "address": address,
            "size": size,
            "requested_size": size,
            "state": state,
            "frames": [],
        }

    segments = [
        # the model's two blocks fill one segment: it goes back whole
        {
            "device": 0,
            "address": A,
            "total_size": 96 * MiB,
            "blocks": [block(A, SIZE[A]), block(B, SIZE[B])],
        },
        # a segment shared with a live block that stays: nothing back
        {
            "device": 0,
            "address": S1,
            "total_size": 80 * MiB,
            "blocks": [block(S1, 64 * MiB), block(X, 16 * MiB)],
        },
        # already free in the cache: empty_cache returns it too
        {
            "device": 0,
            "address": H,
            "total_size": 20 * MiB,
            "blocks": [block(H, 20 * MiB, "inactive")],
        },
    ]
    snap = AllocatorSnapshot(0.0, segments, False)
    opt = HolderWalk(
        "opt", "name", (ref("opt", A, "optimizer params"), ref("opt", S1, "optimizer state"))
    )
    keep = HolderWalk("keep", "name", (ref("keep", X, "tensor", "keep"),))
    report, freed = plan(["model"], [model(), opt, keep], snap)
    (d,) = report.devices
    assert freed == {(0, A), (0, B), (0, S1)}
    assert d.expected_returned == 96 * MiB + 20 * MiB
    assert d.cached_free == 20 * MiB


def test_storages_outside_the_allocator_are_not_counted():
    snap = AllocatorSnapshot(0.0, [], False)  # a tensor from another allocator (DLPack)
    report, freed = plan(["model"], [model()], snap)
    assert report.devices == () and freed == set()


def test_a_library_object_built_on_the_model_goes_with_it_and_a_users_own_does_not():
    def holder(owner, library):
        return HolderWalk(
            owner,
            "name",
            (
                ref(owner, A, "attribute", f"{owner}.model.w"),
                ref(owner, X, "attribute", f"{owner}.buf"),
            ),
            type_name="Trainer",
            library=library,
        )

    report, _ = plan(
        ["model"], [model(), holder("trainer", "transformers.trainer"), holder("exp", "__main__")]
    )
    g = by_holder(report)["trainer"]
    assert g.action == "delete" and g.why == "a Trainer built on model: it goes with it"
    assert [k.holder for k in report.kept] == ["exp"]


def test_a_librarys_state_torn_down_with_the_named_object_is_expected_back():
    state = HolderWalk(
        "vllm.distributed.parallel_state",
        "library",
        (ref("state", H, "attribute", "vllm.distributed.parallel_state._TP.buf"),),
        why="vLLM: torn down as vLLM documents",
        code="destroy_model_parallel()",
        goes_with="model",
    )
    report, freed = plan(["model"], [model(), state])
    g = by_holder(report)["vllm.distributed.parallel_state"]
    assert g.action == "teardown" and g.bytes == SIZE[H]
    assert (0, H) in freed
    (d,) = report.devices
    assert d.held == SIZE[A] + SIZE[B]  # the named object's own
    assert d.expected_freed == SIZE[A] + SIZE[B] + SIZE[H]


def test_freeing_the_optimizer_frees_its_state_and_keeps_the_model():
    opt = HolderWalk(
        "opt",
        "name",
        (
            ref("opt", A, "optimizer params", "opt.param_groups[0][0]"),
            ref("opt", B, "gradients", "opt.param_groups[0][0].grad"),
            ref("opt", S1, "optimizer state", "opt.state[0]['exp_avg']"),
        ),
        type_name="AdamW",
    )
    net = HolderWalk(
        "model", "name", (ref("model", A), ref("model", B, "gradients", "model.w.grad"))
    )
    report, freed = plan(["opt"], [net, opt])
    assert [g.holder for g in report.let_go] == ["opt"] and not report.kept
    assert freed == {(0, S1)}
    assert report.devices[0].held == SIZE[S1]


def test_freeing_a_loss_frees_its_graph_and_keeps_the_model_and_the_input():
    total = HolderWalk(
        "total",
        "name",
        (
            ref("total", L, "tensor", "total"),
            ref("total", G1, "autograd graph", "total.grad_fn…MmBackward0._saved_mat1"),
            ref("total", X, "autograd graph", "total.grad_fn…MmBackward0._saved_self"),
            ref("total", A, "autograd graph", "total.grad_fn…leaf"),
        ),
        is_tensor=True,
    )
    xb = HolderWalk("xb", "name", (ref("xb", X, "tensor", "xb"),), is_tensor=True)
    report, freed = plan(["total"], [model(), xb, total])
    assert [g.holder for g in report.let_go] == ["total"] and not report.kept
    assert freed == {(0, L), (0, G1)}
