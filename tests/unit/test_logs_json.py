"""``--log-format json`` / ``VLLM_SR_LOG_FORMAT=json``: one JSON object per line with time,
level, logger, message and an event's fields, on stdout for the service (a real process reads
the environment), on stderr for a worker (its supervisor copies that pipe through)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sr import events
from vllm_sr.errors import UsageError
from vllm_sr.logs import JsonFormatter, make_handler, resolve_log_format

REPO_ROOT = Path(__file__).resolve().parents[2]


def _record(msg: str = "hello", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("vllm_sr.events", logging.WARNING, __file__, 1, msg, (), None)
    record.created = 1_700_000_000.25
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_event_record_is_one_json_object_with_its_fields() -> None:
    record = _record(
        "replica_ejected deployment=primary",
        vllm_sr_event=events.REPLICA_EJECTED,
        vllm_sr_fields={
            "deployment": "primary",
            "replica": "primary-1",
            "timeouts": 3,
            "ejected_until": None,
            "message": "shadowed",
            "cpus": (0, 1),
        },
    )
    line = JsonFormatter("serve", None).format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["time"] == "2023-11-14T22:13:20.250Z"
    assert doc["level"] == "WARNING" and doc["logger"] == "vllm_sr.events"
    assert doc["message"] == "replica_ejected deployment=primary"
    assert doc["event"] == "replica_ejected" and doc["component"] == "serve"
    assert doc["deployment"] == "primary" and doc["replica"] == "primary-1"
    assert doc["timeouts"] == 3 and doc["ejected_until"] is None and doc["cpus"] == [0, 1]
    # An event field never overwrites the line's own keys.
    assert doc["field_message"] == "shadowed"


def test_exception_and_multiline_message_stay_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("two\nlines", exc_info=sys.exc_info())
    line = JsonFormatter("worker", "primary-0").format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "two\nlines" and doc["replica"] == "primary-0"
    assert "ValueError: boom" in doc["exception"]


def test_format_from_flag_then_environment_then_auto() -> None:
    assert resolve_log_format(None, {}) == "auto"
    assert resolve_log_format(None, {"VLLM_SR_LOG_FORMAT": "JSON"}) == "json"
    assert resolve_log_format("text", {"VLLM_SR_LOG_FORMAT": "json"}) == "text"
    with pytest.raises(UsageError, match=r"VLLM_SR_LOG_FORMAT 'xml'.*accepted: auto, text, json"):
        resolve_log_format(None, {"VLLM_SR_LOG_FORMAT": "xml"})
    with pytest.raises(UsageError, match=r"--log-format 'yaml'"):
        resolve_log_format("yaml", {})


def test_json_wins_over_journald_and_picks_the_stream() -> None:
    sent: list[dict[str, str]] = []
    env = {"INVOCATION_ID": "x", "VLLM_SR_LOG_FORMAT": "json"}
    serve = make_handler("serve", env=env, journal_send=lambda **f: sent.append(f))
    worker = make_handler("worker", "primary-0", env=env)
    assert isinstance(serve, logging.StreamHandler) and serve.stream is sys.stdout
    assert isinstance(worker, logging.StreamHandler) and worker.stream is sys.stderr
    assert isinstance(serve.formatter, JsonFormatter)
    # Without the variable the same environment still goes to journald.
    plain = make_handler("serve", env={"INVOCATION_ID": "x"}, journal_send=lambda **f: None)
    assert not isinstance(plain.formatter, JsonFormatter)


def test_real_process_prints_json_lines_on_stdout() -> None:
    code = (
        "import logging\n"
        "from vllm_sr import events\n"
        "from vllm_sr.logs import setup_logging\n"
        "setup_logging('serve')\n"
        "logging.getLogger('vllm_sr.serve').info('frontend on %s', 'x:1')\n"
        "bus = events.EventBus(); bus.add_sink(events.log_sink())\n"
        "bus.publish(events.REPLICA_READY, deployment='primary', replica='primary-0', pid=7)\n"
    )
    env = {"VLLM_SR_LOG_FORMAT": "json", "PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["message"] == "frontend on x:1"
    ready = lines[1]
    assert ready["event"] == "replica_ready" and ready["replica"] == "primary-0"
    assert ready["pid"] == 7 and ready["logger"] == "vllm_sr.events"
    assert proc.stderr == ""
