"""Journald field mapping and handler selection (the real journald is in tests/system)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_sr import events
from vllm_sr.logs import (
    JournalHandler,
    make_handler,
    message_id,
    setup_logging,
    syslog_priority,
    under_systemd,
)

EVENT_NAMES = sorted(
    v for k, v in vars(events).items() if k.isupper() and isinstance(v, str) and "_" in v
)


class Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def __call__(self, **fields: Any) -> None:
        self.sent.append(fields)


def _logger_with(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"test.logs.{id(handler)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def test_event_record_carries_journal_fields() -> None:
    rec = Recorder()
    handler = make_handler("serve", env={"INVOCATION_ID": "abc"}, journal_send=rec)
    bus = events.EventBus()
    bus.add_sink(events.log_sink(_logger_with(handler)))
    bus.publish(
        events.REPLICA_EJECTED,
        deployment="primary",
        replica="primary-1",
        device="cpu",
        pid=4242,
        timeouts=3,
        reason="3 consecutive timeouts",
        ejected_until=None,
    )
    (fields,) = rec.sent
    assert fields["VLLM_SR_EVENT"] == "replica_ejected"
    assert fields["MESSAGE_ID"] == message_id("replica_ejected")
    assert fields["DEPLOYMENT"] == "primary"
    assert fields["REPLICA"] == "primary-1"
    assert fields["DEVICE"] == "cpu"
    assert fields["WORKER_PID"] == "4242"
    assert fields["PRIORITY"] == "4"
    assert fields["VLLM_SR_TIMEOUTS"] == "3"
    assert fields["VLLM_SR_REASON"] == "3 consecutive timeouts"
    assert "VLLM_SR_EJECTED_UNTIL" not in fields  # None values are left out
    assert fields["MESSAGE"].startswith("replica_ejected ")
    assert fields["SYSLOG_IDENTIFIER"] == "vllm-sr"


def test_worker_records_carry_replica_and_pid() -> None:
    rec = Recorder()
    handler = make_handler("worker", "primary-0", env={"JOURNAL_STREAM": "8:1"}, journal_send=rec)
    _logger_with(handler).info("loaded in %d ms", 120)
    (fields,) = rec.sent
    assert fields["REPLICA"] == "primary-0"
    assert fields["WORKER_PID"].isdigit()
    assert fields["MESSAGE"] == "primary-0: loaded in 120 ms"
    assert fields["PRIORITY"] == "6"
    assert fields["VLLM_SR_COMPONENT"] == "worker"
    assert "VLLM_SR_EVENT" not in fields and "MESSAGE_ID" not in fields


def test_exception_text_in_message() -> None:
    rec = Recorder()
    logger = _logger_with(JournalHandler(rec, "serve", None))
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    assert "ValueError: boom" in rec.sent[0]["MESSAGE"]
    assert rec.sent[0]["PRIORITY"] == "3"


def test_unusable_field_names_are_dropped_not_sent() -> None:
    rec = Recorder()
    logger = _logger_with(JournalHandler(rec, "serve", None))
    logger.info("x", extra={"vllm_sr_event": "e_x", "vllm_sr_fields": {"9lives": 1, "a-b": 2}})
    assert rec.sent[0]["VLLM_SR_A_B"] == "2"
    assert not any("9LIVES" in k for k in rec.sent[0])


def test_message_ids_stable_distinct_and_documented() -> None:
    ids = {name: message_id(name) for name in EVENT_NAMES}
    assert len(set(ids.values())) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", v) for v in ids.values())
    doc = (Path(__file__).parents[2] / "docs" / "events.md").read_text()
    documented = dict(re.findall(r"^\| `(\w+)` \| `([0-9a-f]{32})` \|", doc, re.M))
    assert documented == ids


@pytest.mark.parametrize(
    ("level", "prio"),
    [(logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6), (10, 7)],
)
def test_syslog_priority(level: int, prio: int) -> None:
    assert syslog_priority(level) == prio


def test_under_systemd() -> None:
    assert under_systemd({"INVOCATION_ID": "x"})
    assert under_systemd({"JOURNAL_STREAM": "1:2"})
    assert not under_systemd({})


def test_plain_stderr_outside_systemd() -> None:
    code = (
        "import logging, os\n"
        "for k in ('INVOCATION_ID', 'JOURNAL_STREAM'): os.environ.pop(k, None)\n"
        "from vllm_sr.logs import setup_logging\n"
        "setup_logging('worker', 'primary-0')\n"
        "logging.getLogger('x').warning('hello')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert re.search(r" worker\[primary-0\] WARNING hello$", out.stderr.strip())


def test_priority_prefix_on_journal_stream_without_systemd_python() -> None:
    code = (
        "import logging, sys\n"
        "sys.modules['systemd'] = None\n"  # as if systemd-python were not installed
        "from vllm_sr.logs import setup_logging\n"
        "setup_logging('serve')\n"
        "logging.getLogger('x').error('bad config')\n"
    )
    env = {"INVOCATION_ID": "0123", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stderr.strip() == "<3>serve ERROR bad config"


def test_setup_logging_replaces_handlers() -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        setup_logging("serve", level=logging.DEBUG)
        setup_logging("serve", level=logging.DEBUG)
        assert len(root.handlers) == 1 and root.level == logging.DEBUG
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
