"""The control API's router_replay session filter and Router Learning's outcome verdicts on a
real control socket (the fake backend, a real replay log and learning state):
``GET /v1/replay?session_id=``, ``POST /v1/router/outcomes`` (400 without a key, 404 naming an
unknown replay id, a duplicate key, 429 with Retry-After on a fake clock), and
``vllm-sr ctl replay --session`` / ``vllm-sr ctl outcome``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.support.control_fake import FakeBackend, StubRouter, ThreadedControlServer
from tests.support.workers import short_socket_dir
from vllm_sr.cli import main
from vllm_sr.clock import FakeClock
from vllm_sr.commands import ctl
from vllm_sr.config.router_replay import RouterReplayPlugin
from vllm_sr.control.outcome_policy import OutcomePolicy
from vllm_sr.router.learning import adaptation
from vllm_sr.router.learning.runtime import RouterLearning
from vllm_sr.router.learning.settings import LearningSettings
from vllm_sr.router.plugins.replay import ReplayLog


@pytest.fixture
def served() -> Iterator[ThreadedControlServer]:
    d = short_socket_dir(prefix="vsr-oc-")
    backend = FakeBackend({"primary": ["cpu"]})
    try:
        with ThreadedControlServer(backend, d / "c.sock", group=None, heartbeat_s=0.1) as srv:
            yield srv
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run(*argv: str) -> int:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert isinstance(info.value.code, int)
    return info.value.code


def with_chat(served: ThreadedControlServer) -> Any:
    """Two sessions' records (and one without a session) in a real replay log, and learning
    on: the chat router the supervisor reaches through the chat mount."""
    log = ReplayLog()
    conf = RouterReplayPlugin(enabled=True)

    async def add(rid: str, session: dict[str, Any]) -> None:
        await log.record(
            conf, replay_id=rid, decision="coding", recipe="default", original_model="auto",
            selected_model="coder", answered_by="coder", matched_signals=(), body=b"{}",
            stream=False, status=200, latency_ms=3.0, path="upstream", response=None,
            session=session,
        )  # fmt: skip

    served.run(add("a1", {"session_id": "sess-a", "turn_index": 0}))
    served.run(add("b1", {"session_id": "sess-b", "turn_index": 0}))
    served.run(add("n1", {"turn_index": 0}))
    served.run(add("a2", {"session_id": "sess-a", "turn_index": 1}))
    learning = RouterLearning(LearningSettings(enabled=True, adaptation=True))
    decisions = {("default", "coding"): SimpleNamespace(name="coding", tier=0)}
    chat = SimpleNamespace(replay=log, learning=learning, decisions=decisions)
    served.backend.router = StubRouter(replay=log.read, chat=chat)
    return chat


def client(served: ThreadedControlServer) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(served.path))
    return httpx.Client(transport=transport, base_url="http://localhost", timeout=10)


def post(c: httpx.Client, body: dict[str, Any], key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return c.post("/v1/router/outcomes", json=body, headers=headers)


def test_replay_reads_one_session(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with_chat(served)
    with client(served) as c:
        doc = c.get("/v1/replay", params={"session_id": "sess-a"}).json()
        assert [(r["id"], r["turn_index"]) for r in doc["records"]] == [("a1", 0), ("a2", 1)]
        assert len(c.get("/v1/replay").json()["records"]) == 4  # no filter: all
    sock = ("--socket", str(served.path))
    assert run("ctl", "replay", "--session", "sess-b", "--json", *sock) == 0
    (rec,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (rec["id"], rec["session_id"]) == ("b1", "sess-b")
    served.run(served.backend.router.chat.replay.append_outcome("a2", {"verdict": "good_fit"}))
    assert run("ctl", "replay", "--session", "sess-a", *sock) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("id=a1 session=sess-a turn=0")
    assert lines[1].endswith("id=a2 session=sess-a turn=1 outcomes=good_fit")


def test_a_verdict_through_the_socket(served: ThreadedControlServer) -> None:
    chat = with_chat(served)
    good = {"replay_id": "a1", "target": "model", "verdict": "good_fit"}
    with client(served) as c:
        missing = post(c, good, None)
        assert missing.status_code == 400
        assert missing.json()["error"]["code"] == "missing_idempotency_key"
        unknown = post(c, {**good, "replay_id": "zz9"}, "k0")
        assert unknown.status_code == 404 and "'zz9'" in unknown.json()["error"]["message"]
        bad = post(c, {**good, "verdict": "meh"}, "k0")
        assert bad.status_code == 400 and "verdict 'meh'" in bad.json()["error"]["message"]
        first = post(c, good, "k1")
        assert first.status_code == 200
        doc = first.json()
        assert (doc["success"], doc["updated"], doc["recorded"], doc["model"]) == (
            True,
            1,
            True,
            "coder",
        )
        assert doc["timestamp"].endswith("Z")
        again = post(c, good, "k1").json()
        assert (again["success"], again["duplicate"], again["updated"]) == (True, True, 0)
    assert chat.learning.state.experience.snapshot("coding", 0, "coder").good_fit == 1


def test_over_the_rate_limit_is_429_with_retry_after(served: ThreadedControlServer) -> None:
    with_chat(served)
    clock = FakeClock()
    served.server.outcomes = OutcomePolicy(clock, limit=2)
    good = {"replay_id": "a1", "target": "model", "verdict": "good_fit"}
    with client(served) as c:
        assert post(c, good, "k1").status_code == 200
        clock.advance(10)
        assert post(c, good, "k2").status_code == 200
        limited = post(c, good, "k3")
        assert limited.status_code == 429 and limited.headers["Retry-After"] == "50"
        assert limited.json()["error"] == {
            "code": "rate_limited",
            "message": limited.json()["error"]["message"],
            "retryable": True,
        }
        clock.advance(50)
        assert post(c, good, "k3").status_code == 200


def test_ctl_outcome(served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    chat = with_chat(served)
    sock = ("--socket", str(served.path))
    assert run("ctl", "outcome", "a1", "underpowered", "--key", "k1", *sock) == 0
    assert "underpowered on a1: filed for coder" in capsys.readouterr().out
    assert run("ctl", "outcome", "a1", "underpowered", "--key", "k1", *sock) == 0
    assert "already applied (key k1)" in capsys.readouterr().out
    assert run("ctl", "outcome", "a1", "good_fit", "--model", "general", *sock) == 1
    assert "selected model is 'coder'" in capsys.readouterr().err
    assert run("ctl", "outcome", "nope", "good_fit", *sock) == 1
    assert "replay_id 'nope'" in capsys.readouterr().err
    exp = chat.learning.state.experience.snapshot("coding", 0, "coder")
    assert (exp.underpowered, exp.good_fit) == (1, 0)


def test_ctl_knows_upstreams_verdicts_and_targets() -> None:
    from vllm_sr.router.learning import outcomes

    assert ctl.VERDICTS == adaptation.VERDICTS and ctl.TARGETS == outcomes.TARGETS
