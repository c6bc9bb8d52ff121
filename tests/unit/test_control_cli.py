"""`vllm-sr status` and `vllm-sr ctl` against a real server with the fake backend: output,
--json, and the exit codes (0 done, 1 refused or failed, 2 usage, 3 not running)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.control_fake import (
    FakeBackend,
    StubRouter,
    ThreadedControlServer,
    sample_adaptive_threads,
)
from tests.support.workers import short_socket_dir
from vllm_sr import errors
from vllm_sr.cli import main
from vllm_sr.commands.ctl import SOCKET_ENV, default_command_timeout, default_socket
from vllm_sr.config import service as service_config
from vllm_sr.control import render
from vllm_sr.supervisor.reconfigure import RELOAD_MARGIN_S


@pytest.fixture
def served() -> Iterator[ThreadedControlServer]:
    d = short_socket_dir(prefix="vsr-cli-")
    backend = FakeBackend({"primary": ["cpu", "cpu"], "edge": ["rocm:0"]})
    try:
        with ThreadedControlServer(backend, d / "c.sock", group=None, heartbeat_s=0.1) as srv:
            yield srv
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # rich wraps tables to the terminal width


def run(*argv: str) -> int:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    code = info.value.code
    assert isinstance(code, int)
    return code


def test_status_table(served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    served.call(lambda: served.backend.set_traffic("primary-1", inflight=7))
    served.call(lambda: served.backend.fail("edge-0", "golden check failed"))
    assert run("ctl", "eject", "primary-0", "--for", "90s", "--socket", str(served.path)) == 0
    capsys.readouterr()
    assert run("status", "--socket", str(served.path)) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("primary-")}
    assert "ejected" in rows["primary-0"] and "1m2" in rows["primary-0"]  # ~1m29s left
    assert "7/32" in rows["primary-1"] and "ready" in rows["primary-1"]
    assert "primary (vllm-sr/d3-edge) degraded  2/2 ready, 1 ejected" in out
    assert "rocm:0" in out and out.startswith("vllm-sr 0.1.0 on ")
    assert "edge-0: golden check failed" in out


def test_status_piped_prints_whole_values(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 39: `vllm-sr status | grep primary-0` found nothing while a replica drained: a
    # pipe got rich's 80 columns, which cut ids and headers to "primary…" and "restar…".
    # capsys is not a terminal, so this is what a pipe gets; COLUMNS (rich's width) is unset.
    monkeypatch.delenv("COLUMNS")
    d = short_socket_dir(prefix="vsr-cli-")
    backend = FakeBackend()
    backend.reset({"primary-embeddings": ["rocm:0", "rocm:1"]}, first_pid=4_000_000)
    try:
        with ThreadedControlServer(backend, d / "c.sock", group=None, heartbeat_s=0.1) as srv:
            srv.call(lambda: srv.backend.fail("primary-embeddings-1", "golden check failed"))
            sock = ("--socket", str(srv.path))
            assert run("ctl", "drain", "primary-embeddings-0", *sock) == 0
            capsys.readouterr()
            assert run("status", *sock) == 0
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out = capsys.readouterr().out
    assert "\u2026" not in out and "\x1b" not in out  # nothing cut, no colour codes
    header = next(line.split() for line in out.splitlines() if line.startswith("replica "))
    assert header[-4:] == ["restarts", "ejections", "ejected", "for"]
    (row,) = [line for line in out.splitlines() if line.startswith("primary-embeddings-0 ")]
    assert row.split()[1:5] == ["draining", "rocm:0", "-", "4000000"]
    assert "primary-embeddings-1: golden check failed" in out.splitlines()
    assert all(line == line.rstrip() for line in out.splitlines())  # no padding to a width


def test_status_json(served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("status", "--json", "--socket", str(served.path)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in doc["deployments"]] == ["primary", "edge"]


def test_not_running_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "none.sock"
    assert run("status", "--socket", str(path)) == errors.EXIT_NOT_RUNNING
    assert "vllm-sr is not running" in capsys.readouterr().err
    assert run("ctl", "reload", "--socket", str(path)) == errors.EXIT_NOT_RUNNING


def test_eject_with_duration(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("ctl", "eject", "primary-1", "--for", "30s", "--socket", str(served.path)) == 0
    assert "eject primary-1: done" in capsys.readouterr().out
    command = served.backend.commands[-1]
    assert (command.kind, command.replica, command.duration_ms) == ("eject", "primary-1", 30000)


def test_bad_duration_is_usage(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run("ctl", "eject", "primary-1", "--for", "3 fortnights", "--socket", str(served.path)) == 2
    )
    assert "--for: '3 fortnights' is not a duration" in capsys.readouterr().err
    assert served.backend.commands == []


def test_refusals_are_exit_1(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("ctl", "drain", "primary-9", "--socket", str(served.path)) == 1
    assert "no replica 'primary-9'" in capsys.readouterr().err
    served.backend.refuse = errors.Forbidden("uid 1000 may read but not change the service")
    assert run("ctl", "restart", "primary-0", "--socket", str(served.path)) == 1
    assert "may read but not change" in capsys.readouterr().err


def test_scale_reload_readmit_json(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = ("--socket", str(served.path))
    assert run("ctl", "scale", "primary", "3", "--json", *sock) == 0
    assert json.loads(capsys.readouterr().out)["started"] == ["primary-2"]
    assert run("ctl", "reload", "--json", *sock) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert run("ctl", "eject", "primary-0", *sock) == 0
    assert run("ctl", "readmit", "primary-0", "--json", *sock) == 0
    eject_line, readmit_json = capsys.readouterr().out.split("\n", 1)
    assert eject_line.startswith("eject primary-0: done")
    assert json.loads(readmit_json)["state"] == "ready"
    kinds = [c.kind for c in served.backend.commands]
    assert kinds == ["scale", "reload", "eject", "readmit"]


def test_refused_reload_exits_1_with_every_problem_on_stderr(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the unit's ExecReload= prints when the new config is refused: systemd shows it.
    problems = [
        "/etc/vllm-sr/config.yaml:9: ...primary.bogus_setting: unknown key",
        "/etc/vllm-sr/config.yaml:12: ...primary.timeout_ms: -1: must be > 0",
    ]
    served.backend.refuse = errors.ConfigError("/etc/vllm-sr/config.yaml: 2 problem(s)", problems)
    # 1, as for every refusal: 78 is the service's own "do not restart me", not the CLI's.
    assert run("ctl", "reload", "--socket", str(served.path)) == errors.EXIT_FAILURE
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"vllm-sr: {p}" for p in problems]
    assert captured.out == ""
    served.backend.refuse = errors.VllmSrError("new worker primary-2 failed: exit 78")
    assert run("ctl", "reload", "--socket", str(served.path)) == errors.EXIT_FAILURE
    assert capsys.readouterr().err == "vllm-sr: new worker primary-2 failed: exit 78\n"


def test_reload_waits_as_long_as_the_service_may(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = tmp_path / "vllm-sr.toml"
    monkeypatch.setattr(service_config, "DEFAULT_SERVICE_CONFIG_PATH", settings)
    assert default_command_timeout() == 900.0  # no settings file: 600 s ready timeout
    settings.write_text("ready_timeout_s = 1800\n")
    # The service's own bound on a reload is the ready timeout + RELOAD_MARGIN_S.
    assert default_command_timeout() == 1800.0 + 2 * RELOAD_MARGIN_S
    settings.write_text("ready_timeout_s = 'soon'\n")
    assert default_command_timeout() == 900.0  # the service cannot run on these either


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("ctl") == 2
    assert run("ctl", "scale", "primary", "many") == 2
    assert run("ctl", "scale", "primary", "-1", "--socket", "/nonexistent.sock") == 2


def test_events_since_json(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = ("--socket", str(served.path))
    run("ctl", "eject", "primary-0", *sock)
    # Not primary-1: draining the last serving replica readmits the ejected one (the pool).
    run("ctl", "drain", "edge-0", *sock)
    capsys.readouterr()
    assert run("ctl", "events", "--since", "1", "--json", *sock) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["seq"], e["event"]) for e in lines] == [(2, "replica_draining")]
    assert run("ctl", "events", *sock) == 0
    text = capsys.readouterr().out
    assert "#1 replica_ejected" in text and "reason=manual" in text


def test_events_follow_ends_when_the_service_stops(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = ("--socket", str(served.path))
    run("ctl", "eject", "primary-0", *sock)
    bus = served.backend.events

    def stop_when_subscribed() -> None:
        end = time.monotonic() + 10
        while bus.subscriber_count == 0 and time.monotonic() < end:
            time.sleep(0.01)
        served.run(served.server.stop())

    stopper = threading.Thread(target=stop_when_subscribed)
    stopper.start()
    assert run("ctl", "events", "--follow", "--since", "0", *sock) == 0
    stopper.join(10)
    captured = capsys.readouterr()
    assert "replica_ejected" in captured.out
    assert "the service is stopping" in captured.err


def test_threads(served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    served.call(lambda: served.backend.set_adaptive_threads("primary-0", sample_adaptive_threads()))
    assert run("ctl", "threads", "--socket", str(served.path)) == 0
    out = capsys.readouterr().out
    block = out.split("primary-1:")[0]
    assert "mode 1  state learned" in block and "9-16" in block
    assert "recommended: pin --threads 1" in block
    assert "adaptive threads off" in out.split("primary-1:")[1]
    assert run("ctl", "threads", "--json", "--socket", str(served.path)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["primary-0"]["state"] == "learned" and doc["edge-0"] is None


def test_default_socket_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SOCKET_ENV, "/tmp/elsewhere.sock")
    assert default_socket() == "/tmp/elsewhere.sock"


@pytest.mark.parametrize(
    ("text", "ms"), [("30s", 30000), ("500ms", 500), ("2m", 120000), ("1.5", 1500), ("1h", 3600000)]
)
def test_parse_duration(text: str, ms: int) -> None:
    assert render.parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "s", "-3s", "2d", "0s", "2h"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(errors.UsageError, match="--for"):
        render.parse_duration_ms(text)


def test_ejection_left_and_format() -> None:
    replica = {"state": "ejected", "ejected_until": 1000.0}
    assert render.ejection_left(replica, 970.0) == "30.0s"
    assert render.ejection_left(replica, 1200.0) == "0ms"
    assert render.ejection_left({"state": "ready", "ejected_until": None}, 0) == "-"
    assert render.format_seconds(125) == "2m05s" and render.format_seconds(7300) == "2h01m"


def test_default_socket_from_host_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_sr.config import service

    toml = tmp_path / "vllm-sr.toml"
    toml.write_text('control_socket = "/tmp/from-settings.sock"\n')
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.setattr(service, "DEFAULT_SERVICE_CONFIG_PATH", toml)
    assert default_socket() == "/tmp/from-settings.sock"
    monkeypatch.setattr(service, "DEFAULT_SERVICE_CONFIG_PATH", tmp_path / "absent.toml")
    assert default_socket() == "/run/vllm-sr/control.sock"


def test_the_cli_side_imports_no_worker_numpy_or_server_library() -> None:
    # `ctl threads` prints the learner's report without the worker (numpy, torch), and the
    # clients need no aiohttp: a fresh interpreter shows what importing them pulls in.
    code = (
        "import sys\n"
        "from vllm_sr.commands import ctl, status\n"
        "from vllm_sr.control import client, render\n"
        "ctl._format_threads(None)\n"
        "print(sorted(m for m in ('numpy', 'vllm_sr.worker', 'aiohttp') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_status_shows_router_backends_and_decisions() -> None:
    from rich.console import Console

    from vllm_sr.control.render import status_view

    inventory = {
        "service": {"version": "0", "host": "h", "pid": 1, "uptime_s": 1.0, "generation": 0},
        "deployments": [],
        "router": {
            "backends": [
                {"model": "coder", "url": "http://127.0.0.1:8001/v1", "state": "healthy",
                 "requests_per_s": 2.5, "latency_p50_ms": 12.0, "latency_p99_ms": 40.0,
                 "errors": 1, "last_error": None},
                {"model": "general", "url": "http://127.0.0.1:8000/v1", "state": "unhealthy",
                 "requests_per_s": 0, "latency_p50_ms": None, "latency_p99_ms": None,
                 "errors": 0, "last_error": "connection refused"},
            ],
            "stats": {"decisions": [{"decision": "coding", "model": "coder", "count": 7}],
                      "fallbacks": {"signals:overloaded": 2},
                      "unknown_signals": [
                          {"family": "embedding", "reason": "overloaded", "count": 5}]},
        },
    }  # fmt: skip
    console = Console(width=140, record=True)
    console.print(status_view(inventory, now=0.0))
    text = console.export_text()
    assert "coder" in text and "connection refused" in text and "2.5" in text
    assert (
        "decisions: coding->coder 7; fallbacks: signals:overloaded 2; "
        "unknown signals: embedding/overloaded 5"
    ) in text
    assert "signal processes" not in text  # none running


def test_status_shows_the_signal_processes() -> None:
    from rich.console import Console

    from vllm_sr.control.render import status_view

    inventory = {
        "service": {"version": "0", "host": "h", "pid": 1, "uptime_s": 1.0, "generation": 0},
        "deployments": [],
        "router": {"backends": [], "stats": {}},
        "signal_processes": [
            {"id": "signals-0", "pid": 812, "state": "ready", "inflight": 2, "jobs": 40,
             "failed_jobs": 0, "restarts": 0, "restart_reason": None, "last_error": None},
            {"id": "signals-1", "pid": None, "state": "backoff", "inflight": 0, "jobs": 9,
             "failed_jobs": 3, "restarts": 1, "restart_reason": "killed by signal 9",
             "last_error": "killed by signal 9"},
        ],
    }  # fmt: skip
    console = Console(width=160, record=True)
    console.print(status_view(inventory, now=0.0))
    assert (
        "signal processes  signals-0 ready pid 812 jobs 40 in-flight 2  signals-1 backoff "
        "jobs 9 rst 1 (killed by signal 9) failed 3" in console.export_text()
    )


def test_ctl_replay_reads_records_by_decision_and_follows(
    served: ThreadedControlServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_sr.config.router_replay import RouterReplayPlugin
    from vllm_sr.router.plugins.replay import ReplayLog

    log = ReplayLog()
    conf = RouterReplayPlugin(enabled=True, max_body_bytes=8)

    async def add(decision: str, status: int = 200) -> None:
        await log.record(
            conf, replay_id=log.new_id(), decision=decision, recipe="default",
            original_model="auto", selected_model="coder", answered_by="coder",
            matched_signals=("keyword:code",), body=b'{"model": "auto", "messages": []}',
            stream=False, status=status, latency_ms=12.5, path="upstream", response=None,
            response_body=b"{}",
        )  # fmt: skip

    served.run(add("coding"))
    served.run(add("billing", 502))
    served.backend.router = StubRouter(replay=log.read)
    sock = ("--socket", str(served.path))
    assert run("ctl", "replay", "--decision", "billing", "--json", *sock) == 0
    (rec,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (rec["decision"], rec["response_status"], rec["seq"]) == ("billing", 502, 2)
    assert rec["request_body"] == '{"model"' and rec["request_body_truncated"] is True
    assert run("ctl", "replay", "--recipe", "other", *sock) == 0
    assert capsys.readouterr().out == ""  # both records are the default recipe's
    assert run("ctl", "replay", *sock) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "#1 coding -> coder 200 12 ms upstream" in lines[0]

    handed = threading.Event()  # the follower was given record 3

    async def read(
        decision: str | None, since: int, recipe: str | None, session: str | None
    ) -> dict[str, Any]:
        answer = await log.read(decision, since, recipe, session)
        if any(r["seq"] == 3 for r in answer["records"]):
            handed.set()
        return answer

    served.backend.router = StubRouter(replay=read)

    def add_then_stop() -> None:
        served.run(add("coding"))
        handed.wait(10)
        served.run(served.server.stop())

    stopper = threading.Thread(target=add_then_stop)
    stopper.start()
    code = run("ctl", "replay", "--follow", "--since", "2", *sock)
    stopper.join(10)
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in out] == ["#3"]  # only the new record, once
    assert code == 3  # the service went away


def test_backends_table_shows_an_ejected_backend_as_ejected() -> None:
    """A backend out after consecutive 5xx (``ejected_for_s`` > 0) is not "ready" in
    `vllm-sr status` and vllm-sr-top, though its health check still passes."""
    from rich.console import Console

    from vllm_sr.control.render import backend_state, backends_table

    assert backend_state({"state": "healthy", "ejected_for_s": 12.5}) == "ejected"
    assert backend_state({"state": "healthy", "ejected_for_s": 0.0}) == "ready"
    assert backend_state({"state": "unhealthy"}) == "failed"
    console = Console(width=200, record=True)
    router = {
        "backends": [{"model": "m", "url": "http://a", "state": "healthy", "ejected_for_s": 3}]
    }
    console.print(backends_table(router))
    assert "ejected" in console.export_text()
