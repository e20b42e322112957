"""The panel protocol: schema drift, validation, every action, the stream."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest

from jupyter_gpumem import protocol
from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.core.history import History
from jupyter_gpumem.protocol import schema
from jupyter_gpumem.protocol.handler import ACTIONS, Handler
from jupyter_gpumem.protocol.stream import SampleStream
from jupyter_gpumem.testing.replay import RecordedAttribution, ReplayBackend
from tests.fakes import FIXTURES

S = schema()


def check(instance, ref):
    jsonschema.validate(instance, {**S, "$ref": f"#/$defs/{ref}"})


class ListChannel:
    comm_id = "test-comm"

    def __init__(self):
        self.messages = []

    def send(self, data):
        self.messages.append(data)


class FakeSession:
    """The protocol's Services without IPython: no history, no attribution."""

    def __init__(self, collector):
        self.collector = collector
        self.history = History(10)
        self.busy = False
        self.report_listeners = []
        self.last_report = None
        self.who = None
        self.postmortems = None
        self.frees = None


@pytest.fixture
def handler(request):
    # A frozen replay clock keeps one recorded frame for exact comparisons; the stream
    # test asks for real time so that frames (and samples) change.
    live = getattr(request, "param", False)
    clock = time.monotonic if live else (lambda: 0.0)
    c = Collector(ReplayBackend(str(FIXTURES), clock=clock))
    channel = ListChannel()
    stream = SampleStream(c, channel)
    h = Handler(FakeSession(c), stream)
    h.channel = channel
    yield h
    stream.stop()


def req(h, action, **args):
    reply = h.handle({"protocol": 1, "action": action, "args": args})
    check(reply, "reply")
    if reply["status"] == "ok":
        check(reply["result"], f"results/{action}")
    return reply


def test_schema_lists_exactly_the_implemented_actions():
    assert list(S["actions"]) == list(ACTIONS)
    assert S["$defs"]["request"]["properties"]["action"]["enum"] == list(ACTIONS)
    assert set(S["$defs"]["results"]) == set(ACTIONS)
    assert S["protocol_version"] == protocol.PROTOCOL_VERSION
    assert S["request_msg_type"] == protocol.REQUEST and S["reply_msg_type"] == protocol.REPLY
    assert S["comm_target"] == protocol.COMM_TARGET


def test_schema_arguments_match_handler_signatures():
    import inspect

    for name, method in ACTIONS.items():
        params = [p for p in inspect.signature(method).parameters if p != "self"]
        assert sorted(params) == sorted(S["actions"][name].get("properties", {})), name


def test_docs_name_every_action():
    doc = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
    for name in ACTIONS:
        assert f"| `{name}` |" in doc


def test_hello_and_sample_validate(handler):
    r = req(handler, "hello")
    assert r["result"]["actions"] == list(ACTIONS)
    dev = r["result"]["sample"]["devices"][0]
    assert dev["name"] == "NVIDIA H200" and dev["allocated"] > 0
    # the figures are the recording's, and the sample says where it was made
    meta = json.loads(FIXTURES.read_text())["meta"]
    replay = r["result"]["sample"]["replay"]
    assert replay["gpu"] == meta["device"] and replay["torch_version"] == meta["torch"]
    assert replay["recorded"] == meta["recorded"]
    assert replay["description"].startswith(f"replay: readings recorded on an {meta['device']}")
    assert r["result"]["sample"]["message"] == ""  # the state is ok: nothing to explain
    check(r["result"]["sample"], "sample")
    req(handler, "sample")


def test_actions_change_what_the_sample_says(handler):
    before = req(handler, "sample")["result"]["sample"]["devices"][0]
    r = req(handler, "empty_cache")
    released = r["result"]["released"]["0"]
    after = r["result"]["sample"]["devices"][0]
    assert released == before["reserved"] - before["allocated"] > 0
    assert after["reserved"] == after["allocated"]
    r = req(handler, "set_caching", enabled=False)
    assert r["result"]["caching"] is False and r["result"]["sample"]["caching"] is False
    assert req(handler, "set_caching", enabled=True)["result"]["caching"] is True
    r = req(handler, "set_limit", fraction=0.25)
    lim = r["result"]["limit"]
    assert lim["fraction"] == 0.25 and r["result"]["sample"]["devices"][0]["limit"] == lim
    assert req(handler, "set_limit")["result"]["limit"] is None
    r = req(handler, "reset_peak", device=0)
    d = r["result"]["sample"]["devices"][0]
    assert d["peak_allocated"] == d["allocated"]


@pytest.mark.parametrize(
    ("content", "code", "text"),
    [
        ({"protocol": 2, "action": "hello"}, "unsupported_protocol", "speaks protocol 1"),
        ({"protocol": 1}, "bad_request", "missing action"),
        ("hello", "bad_request", "must be an object"),
        ({"protocol": 1, "action": "exec", "args": {"code": "1"}}, "unknown_action", "'exec'"),
        ({"protocol": 1, "action": "set_caching", "args": {}}, "bad_request", "missing argument"),
        (
            {"protocol": 1, "action": "set_caching", "args": {"enabled": 1}},
            "bad_request",
            "enabled must be a boolean",
        ),
        (
            {"protocol": 1, "action": "set_limit", "args": {"fraction": 1.5}},
            "bad_request",
            "fraction must be <= 1",
        ),
        (
            {"protocol": 1, "action": "set_limit", "args": {"fraction": 0}},
            "bad_request",
            "fraction must be > 0",
        ),
        (
            {"protocol": 1, "action": "set_limit", "args": {"fraction": 0.5, "bytes": 10}},
            "bad_request",
            "not both",
        ),
        (
            {"protocol": 1, "action": "set_limit", "args": {"device": 9, "fraction": 0.5}},
            "refused",
            "no device 9",
        ),
        (
            {"protocol": 1, "action": "subscribe", "args": {"interval_ms": 5}},
            "bad_request",
            "interval_ms must be >= 100",
        ),
        ({"protocol": 1, "action": "sample", "args": {"x": 1}}, "bad_request", "unknown argument"),
        ({"protocol": 1, "action": "sample", "args": []}, "bad_request", "args must be an object"),
    ],
)
def test_bad_requests_get_error_replies(handler, content, code, text):
    reply = handler.handle(content)
    check(reply, "reply")
    assert reply["status"] == "error" and reply["error"]["code"] == code
    assert text in reply["error"]["message"]
    assert req(handler, "sample")["status"] == "ok"  # still working


def test_free_is_refused_where_the_kernel_cannot_free(handler):
    # GIVEN a kernel without the free service (a bare session)
    # WHEN the panel asks to free a name
    reply = req(handler, "free", names=["model"], dry=True)
    # THEN a refusal in one sentence, and the kernel keeps answering
    assert reply["error"] == {
        "code": "refused",
        "message": "freeing is not available in this kernel",
    }
    assert req(handler, "sample")["status"] == "ok"


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ({}, "missing argument 'names'"),
        ({"names": []}, "names has 0 items, at least 1 needed"),
        ({"names": [""]}, "names[0] is too short"),
        ({"names": ["a"], "dry": 1}, "dry must be a boolean"),
        ({"names": "model"}, "names must be an array"),
    ],
)
def test_free_checks_its_arguments(handler, args, text):
    reply = handler.handle({"protocol": 1, "action": "free", "args": args})
    check(reply, "reply")
    assert reply["error"]["code"] == "bad_request" and text in reply["error"]["message"]


def test_tool_failure_is_a_failed_reply(handler):
    def boom(*a, **k):
        raise RuntimeError("nvml went away")

    handler.services.collector.measure = boom
    reply = handler.handle({"protocol": 1, "action": "sample"})
    assert reply["error"] == {"code": "failed", "message": "RuntimeError: nvml went away"}


@pytest.mark.parametrize("handler", [True], indirect=True)
def test_stream_pushes_changes_and_cells(handler):
    r = req(handler, "subscribe", interval_ms=100, heartbeat_ms=500, client="tab-1")
    st = r["result"]["stream"]
    assert st["active"] and st["comm_id"] == "test-comm" and st["clients"] == 1
    assert st["lease_s"] == 60
    time.sleep(1.2)
    from jupyter_gpumem.core.tracker import CellTracker
    from tests.fakes import ScriptedBackend, scenario

    t = CellTracker(Collector(ScriptedBackend(*scenario("keep_n_bytes")[:2])))
    t.begin()
    handler.stream.push_cell(t.end(execution_count=4, first_line="x = f()"))
    msgs = handler.channel.messages
    for m in msgs:
        check(m, "comm_message")
    assert msgs[0]["type"] == "open"
    kinds = [m["type"] for m in msgs[1:]]
    assert kinds[0] == "sample" and kinds.count("sample") >= 2  # the replay changes ~10 Hz
    cells = [m["cell"] for m in msgs if m["type"] == "cell"]
    assert len(cells) == 1 and cells[0]["first_line"] == "x = f()"
    assert cells[0]["devices"][0]["allocated_delta"] == 256 << 20
    seqs = [m["seq"] for m in msgs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    r = req(handler, "unsubscribe", client="tab-1")
    assert r["result"]["stream"]["active"] is False and r["result"]["stream"]["clients"] == 0
    n = len(msgs)
    time.sleep(0.3)
    assert len(handler.channel.messages) == n  # nothing after the last client left


def _heartbeat_stream(clock=time.monotonic, lease_s=60):
    from tests.fakes import ScriptedBackend, scenario

    c = Collector(ScriptedBackend(scenario("keep_n_bytes")[1]))
    ch = ListChannel()
    return SampleStream(c, ch, lambda: True, clock=clock, lease_s=lease_s), ch


def test_stream_heartbeat_when_nothing_changes():
    s, ch = _heartbeat_stream()
    s.subscribe(100, 500)
    time.sleep(1.3)
    s.stop()
    kinds = [m["type"] for m in ch.messages]
    assert kinds[:2] == ["open", "sample"] and kinds.count("sample") == 1
    assert kinds.count("heartbeat") >= 1
    hb = next(m for m in ch.messages if m["type"] == "heartbeat")
    assert hb["busy"] is True


def test_clients_share_the_stream_and_leases_expire():
    now = [1000.0]
    s, _ = _heartbeat_stream(clock=lambda: now[0], lease_s=60)
    s.subscribe(1000, client="a")
    s.subscribe(200, client="b")
    st = s.state()
    assert st["clients"] == 2 and st["interval_ms"] == 200  # the fastest asked for
    assert s.unsubscribe(client="b")["active"] is True  # a still holds it
    assert s.state()["interval_ms"] == 1000
    now[0] += 30
    s.subscribe(1000, client="a")  # renewal
    now[0] += 45
    assert s.state()["clients"] == 1
    now[0] += 20  # 65 s after the renewal: lease gone
    time.sleep(1.2)  # the thread sees it at its next wake-up and stops
    st = s.state()
    assert st["clients"] == 0 and st["active"] is False


def test_schema_file_is_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(S)
    assert json.loads((Path(protocol.__file__).parent / "schema.json").read_text()) == S


def test_empty_cache_collects_garbage_only_when_asked(handler, monkeypatch):
    import gc

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    req(handler, "empty_cache")
    assert calls == []
    req(handler, "empty_cache", collect_garbage=True)
    assert calls == [()]


def test_replay_empty_cache_keeps_figures_consistent(handler):
    d = req(handler, "empty_cache")["result"]["sample"]["devices"][0]
    assert d["inactive_split"] <= d["reserved"] - d["allocated"]


@pytest.fixture
def session_handler(shell):
    """A real Session on a real shell, its figures and recorded attribution replayed."""
    from jupyter_gpumem._ipython import compose

    c = Collector(ReplayBackend(str(FIXTURES), clock=lambda: 0.0))
    session = compose(shell, c, RecordedAttribution.beside(str(FIXTURES)))
    stream = SampleStream(c, ListChannel())
    yield Handler(session, stream), session
    stream.stop()


def test_attribution_actions_validate_against_the_schema(session_handler):
    h, session = session_handler
    assert req(h, "track", enabled=True)["result"]["tracking"] == {"active": True, "wanted": True}
    assert req(h, "hello")["result"]["tracking"] == {"active": True, "wanted": True}
    who = req(h, "who", n=3)["result"]
    dev = who["devices"][0]
    assert len([r for r in dev["by_variable"]["rows"] if r["kind"] == "owner"]) <= 4
    assert dev["by_line"] is not None and who["postmortems"]
    seg = req(h, "segments", device=0, max_segments=3)["result"]["devices"][0]
    assert len(seg["segments"]) == 3 and seg["labels"]
    assert req(h, "history")["result"] == {"cells": []}
    assert req(h, "release_traceback")["result"]["frames"] == 0
    assert req(h, "track", enabled=False)["result"]["tracking"]["active"] is False
    assert req(h, "who")["result"]["devices"][0]["by_line"] is None
    session.busy = True  # a cell runs: the namespace is not read
    r = req(h, "who")
    assert r["error"] == {"code": "busy", "message": "busy: available when the cell ends"}
    assert req(h, "segments")["status"] == "ok"  # no namespace needed
    r = req(h, "segments", device=7)
    assert r["error"]["code"] == "refused" and "no device 7" in r["error"]["message"]


def _owners(h) -> dict[str, int]:
    rows = req(h, "who", n=50)["result"]["devices"][0]["by_variable"]["rows"]
    out: dict[str, int] = {}
    for r in rows:
        if r["kind"] == "owner":
            out[r["key"]] = out.get(r["key"], 0) + r["bytes"]
    return out


def test_free_previews_then_frees_on_the_replay_kernel(session_handler):
    h, _ = session_handler
    MiB = 1 << 20
    # GIVEN the recorded owners: base (64 MiB; view, another name for its storage, shows
    # as base's, which ranks first)
    before = _owners(h)
    assert before["base"] == 64 * MiB and "view" not in before
    # WHEN the panel asks for the preview
    preview = req(h, "free", names=["base"], dry=True)["result"]["report"]
    # THEN the plan: base and view deleted, its 64 MiB segment back to the driver, nothing
    # measured, nothing let go yet
    assert preview["done"] is False and preview["names"] == ["base"]
    assert [(g["holder"], g["action"], g["code"]) for g in preview["let_go"]] == [
        ("base", "delete", "del base"),
        ("view", "delete", "del view"),
    ]
    (device,) = preview["devices"]
    assert device["held"] == 64 * MiB and device["expected_returned"] == 64 * MiB
    assert device["returned"] is None and device["freed"] is None
    assert any(n.startswith("replayed on recorded data") for n in preview["notes"])
    assert _owners(h) == before
    # WHEN it frees
    result = req(h, "free", names=["base"])["result"]
    # THEN the same plan, done, with nothing measured; the owners let go are gone from who
    report = result["report"]
    assert report["done"] is True and report["let_go"] == preview["let_go"]
    assert report["devices"][0]["returned"] is None
    assert result["sample"]["devices"]
    after = _owners(h)
    assert after == {k: v for k, v in before.items() if k != "base"}
    allocated = req(h, "who")["result"]["devices"][0]["by_variable"]["allocated"]
    assert allocated == 217111552 - 64 * MiB
    # AND a name let go is unknown from then on, refused with the live sentence
    r = req(h, "free", names=["base"], dry=True)
    assert r["error"] == {
        "code": "refused",
        "message": "'base' is not a variable of this kernel: name a variable, Out[N] or _",
    }


def test_free_refuses_unknown_names_and_waits_for_the_cell(session_handler):
    h, session = session_handler
    r = req(h, "free", names=["modl"], dry=True)
    assert r["error"]["code"] == "refused"
    assert r["error"]["message"] == (
        "'modl' is not a variable of this kernel (did you mean model?): "
        "name a variable, Out[N] or _"
    )
    session.busy = True  # a cell runs: nothing is let go
    r = req(h, "free", names=["model"])
    assert r["error"] == {"code": "busy", "message": "busy: available when the cell ends"}
    session.busy = False
    assert "model" in _owners(h)
