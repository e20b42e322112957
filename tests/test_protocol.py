"""The panel protocol: schema drift, validation, every action, the stream."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest

from jupyter_gpumem import protocol
from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.collectors._replay import ReplayBackend
from jupyter_gpumem.protocol import ACTIONS, Handler, schema
from jupyter_gpumem.protocol.stream import SampleStream
from tests.fakes import FIXTURES

S = schema()


def check(instance, ref):
    jsonschema.validate(instance, {**S, "$ref": f"#/$defs/{ref}"})


class ListChannel:
    comm_id = "test-comm"

    def __init__(self, opening):
        self.messages = [opening]
        self.closed = False

    def send(self, data):
        self.messages.append(data)

    def close(self):
        self.closed = True


class FakeSession:
    def __init__(self, collector):
        self.collector = collector


@pytest.fixture
def handler(request):
    # A frozen replay clock keeps one recorded frame for exact comparisons; the stream
    # test asks for real time so that frames (and samples) change.
    live = getattr(request, "param", False)
    clock = time.monotonic if live else (lambda: 0.0)
    c = Collector(ReplayBackend(str(FIXTURES), clock=clock))
    channels = []

    def open_channel(data):
        ch = ListChannel(data)
        channels.append(ch)
        return ch

    stream = SampleStream(c, open_channel)
    h = Handler(FakeSession(c), stream)
    h.channels = channels
    yield h
    stream.unsubscribe()


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
    assert r["result"]["sample"]["message"] == "replaying recorded samples (test mode)"
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


def test_tool_failure_is_a_failed_reply(handler):
    def boom(*a, **k):
        raise RuntimeError("nvml went away")

    handler.session.collector.measure = boom
    reply = handler.handle({"protocol": 1, "action": "sample"})
    assert reply["error"] == {"code": "failed", "message": "RuntimeError: nvml went away"}


@pytest.mark.parametrize("handler", [True], indirect=True)
def test_stream_pushes_changes_heartbeats_and_cells(handler):
    r = req(handler, "subscribe", interval_ms=100, heartbeat_ms=500)
    assert r["result"]["stream"]["active"] and r["result"]["stream"]["comm_id"] == "test-comm"
    time.sleep(1.2)
    msgs = handler.channels[0].messages
    check(msgs[0], "comm_message")
    assert msgs[0]["type"] == "open"
    for m in msgs:
        check(m, "comm_message")
    kinds = [m["type"] for m in msgs[1:]]
    assert kinds[0] == "sample" and kinds.count("sample") >= 2  # the replay changes ~10 Hz
    seqs = [m["seq"] for m in msgs[1:]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    r = req(handler, "unsubscribe")
    assert r["result"]["stream"]["active"] is False and handler.channels[0].closed
    n = len(msgs)
    time.sleep(0.3)
    assert len(handler.channels[0].messages) == n  # nothing after unsubscribe


def test_stream_heartbeat_when_nothing_changes():
    from tests.fakes import ScriptedBackend, scenario

    c = Collector(ScriptedBackend(scenario("keep_n_bytes")[1]))
    chans = []
    s = SampleStream(c, lambda d: chans.append(ListChannel(d)) or chans[-1], lambda: True)
    s.subscribe(100, 500)
    time.sleep(1.3)
    s.unsubscribe()
    kinds = [m["type"] for m in chans[0].messages[1:]]
    assert kinds[0] == "sample" and kinds.count("sample") == 1
    assert kinds.count("heartbeat") >= 1
    hb = next(m for m in chans[0].messages if m["type"] == "heartbeat")
    assert hb["busy"] is True


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
