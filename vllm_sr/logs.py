"""Logging setup shared by the service and its workers.

Under systemd (``JOURNAL_STREAM`` or ``INVOCATION_ID`` set) and with systemd-python's
``systemd.journal`` importable, every record goes to journald with structured fields, so that
``journalctl -u vllm-sr VLLM_SR_EVENT=replica_ejected`` finds ejections. Otherwise records are
plain lines on stderr (with a ``<N>`` syslog priority prefix when stderr is the journal stream,
so journald still learns the priority)."""

from __future__ import annotations

import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import Any

# MESSAGE_ID = uuid5(MESSAGE_ID_NAMESPACE, event name): stable per event type, and new event
# types get one without a table to keep in step. docs/events.md lists them.
MESSAGE_ID_NAMESPACE = uuid.UUID("6f0d1b7e-3c55-4a8e-9d2c-5a7b1e4f0c21")
SYSLOG_IDENTIFIER = "vllm-sr"

# Event field -> journal field for the fields operators filter on.
_PROMOTED = {"deployment": "DEPLOYMENT", "replica": "REPLICA", "device": "DEVICE"}
_FIELD_NAME = re.compile(r"[^A-Z0-9_]")

JournalSend = Callable[..., Any]


def message_id(event: str) -> str:
    """The journald MESSAGE_ID of an event type (32 lowercase hex digits)."""
    return uuid.uuid5(MESSAGE_ID_NAMESPACE, event).hex


def syslog_priority(levelno: int) -> int:
    """logging level -> syslog PRIORITY (0 emerg .. 7 debug)."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def under_systemd(env: Mapping[str, str] = os.environ) -> bool:
    return bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))


def _journal_name(key: str) -> str | None:
    name = _FIELD_NAME.sub("_", key.upper())
    if not name or name[0].isdigit() or name.startswith("_"):
        return None  # a journal field may not start with a digit; '_' is for trusted fields
    return name


def journal_fields(
    record: logging.LogRecord, message: str, component: str, replica: str | None
) -> dict[str, str]:
    """The journald fields of one record (pure: no I/O)."""
    fields: dict[str, str] = {
        "MESSAGE": message,
        "PRIORITY": str(syslog_priority(record.levelno)),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "VLLM_SR_COMPONENT": component,
        "LOGGER": record.name,
        "CODE_FILE": record.pathname,
        "CODE_LINE": str(record.lineno),
        "CODE_FUNC": record.funcName,
    }
    if replica:
        fields["REPLICA"] = replica
        fields["WORKER_PID"] = str(record.process or os.getpid())
    event = getattr(record, "vllm_sr_event", None)
    if isinstance(event, str):
        fields["VLLM_SR_EVENT"] = event
        fields["MESSAGE_ID"] = message_id(event)
    extra = getattr(record, "vllm_sr_fields", None)
    if isinstance(extra, Mapping):
        for key, value in extra.items():
            if value is None:
                continue
            if key in _PROMOTED:
                fields[_PROMOTED[key]] = str(value)
            elif key == "pid":
                fields["WORKER_PID"] = str(value)
            else:
                name = _journal_name(str(key))
                if name is not None:
                    fields[f"VLLM_SR_{name}"] = str(value)
    return fields


class JournalHandler(logging.Handler):
    """Sends records to journald through an injected ``send(**fields)`` (systemd.journal.send
    in production, a recorder in tests)."""

    def __init__(
        self, send: JournalSend, component: str, replica: str | None, level: int = logging.NOTSET
    ) -> None:
        super().__init__(level)
        self._send = send
        self._component = component
        self._replica = replica

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            self._send(**journal_fields(record, message, self._component, self._replica))
        except Exception:
            self.handleError(record)


class _PriorityFormatter(logging.Formatter):
    """Prefixes ``<N>`` so journald's stream reader assigns the priority (SyslogLevelPrefix)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{syslog_priority(record.levelno)}>{super().format(record)}"


def _load_journal_send() -> JournalSend | None:
    try:
        from systemd import journal  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None

    def send(**fields: str) -> None:
        # sendv, not journal.send: send() wants CODE_LINE as an int and fills in fields of
        # its own; sendv passes KEY=value pairs through as given (newlines included).
        journal.sendv(*(f"{key}={value}" for key, value in fields.items()))

    return send


def make_handler(
    component: str,
    replica: str | None = None,
    env: Mapping[str, str] = os.environ,
    journal_send: JournalSend | None = None,
) -> logging.Handler:
    """The handler ``setup_logging`` installs; split out so tests can pick the environment."""
    label = f"{replica}: " if replica else ""
    if under_systemd(env):
        send = journal_send if journal_send is not None else _load_journal_send()
        if send is not None:
            handler: logging.Handler = JournalHandler(send, component, replica)
            handler.setFormatter(logging.Formatter(f"{label}%(message)s"))
            return handler
        # No systemd-python: journald timestamps and tags the stream itself.
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_PriorityFormatter(f"{component} {label}%(levelname)s %(message)s"))
        return handler
    prefix = f"{component}[{replica}]" if replica else component
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix} %(levelname)s %(message)s"))
    return handler


def setup_logging(component: str, replica: str | None = None, level: int = logging.INFO) -> None:
    """Configure the root logger once for this process (replaces any earlier handlers)."""
    root = logging.getLogger()
    root.handlers[:] = [make_handler(component, replica)]
    root.setLevel(level)
