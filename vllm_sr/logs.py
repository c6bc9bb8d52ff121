"""Logging setup shared by the service and its workers.

Under systemd (``JOURNAL_STREAM`` or ``INVOCATION_ID`` set) and with systemd-python's
``systemd.journal`` importable, every record goes to journald with structured fields, so that
``journalctl -u vllm-sr VLLM_SR_EVENT=replica_ejected`` finds ejections. Otherwise records are
plain lines on stderr (with a ``<N>`` syslog priority prefix when stderr is the journal stream,
so journald still learns the priority).

``--log-format json`` (or ``VLLM_SR_LOG_FORMAT=json`` in the environment, which the service's
workers inherit) writes one JSON object per line instead: ``time`` (UTC, RFC 3339), ``level``,
``logger``, ``message``, ``component``, ``replica``, and for an event its name as ``event`` with
its fields beside it. Inside a container that is what a log collector wants; under systemd the
journal fields carry the same information, so ``auto`` keeps journald there."""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from vllm_sr.errors import UsageError

# MESSAGE_ID = uuid5(MESSAGE_ID_NAMESPACE, event name): stable per event type, and new event
# types get one without a table to keep in step. docs/events.md lists them.
MESSAGE_ID_NAMESPACE = uuid.UUID("6f0d1b7e-3c55-4a8e-9d2c-5a7b1e4f0c21")
SYSLOG_IDENTIFIER = "vllm-sr"

# Event field -> journal field for the fields operators filter on.
_PROMOTED = {"deployment": "DEPLOYMENT", "replica": "REPLICA", "device": "DEVICE"}
_FIELD_NAME = re.compile(r"[^A-Z0-9_]")

JournalSend = Callable[..., Any]

LOG_FORMAT_ENV = "VLLM_SR_LOG_FORMAT"
LOG_FORMATS = ("auto", "text", "json", "journald")
# Keys of a JSON line that an event field may not overwrite (it is renamed field_<key>);
# an event's replica field names the replica, as the line's own does.
_JSON_RESERVED = frozenset(
    {"time", "level", "logger", "message", "component", "event", "exception"}
)


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


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


def json_fields(
    record: logging.LogRecord, message: str, component: str, replica: str | None
) -> dict[str, Any]:
    """The JSON object of one record (pure: no I/O)."""
    stamp = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    doc: dict[str, Any] = {
        "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname,
        "logger": record.name,
        "message": message,
        "component": component,
    }
    if replica:
        doc["replica"] = replica
    event = getattr(record, "vllm_sr_event", None)
    if isinstance(event, str):
        doc["event"] = event
    extra = getattr(record, "vllm_sr_fields", None)
    if isinstance(extra, Mapping):
        for key, value in extra.items():
            name = str(key)
            doc[f"field_{name}" if name in _JSON_RESERVED else name] = _json_value(value)
    if record.exc_info:
        doc["exception"] = logging.Formatter().formatException(record.exc_info)
    return doc


class JsonFormatter(logging.Formatter):
    """One JSON object per line (newlines inside the message stay escaped in the string)."""

    def __init__(self, component: str, replica: str | None) -> None:
        super().__init__()
        self._component = component
        self._replica = replica

    def format(self, record: logging.LogRecord) -> str:
        doc = json_fields(record, record.getMessage(), self._component, self._replica)
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def resolve_log_format(log_format: str | None, env: Mapping[str, str] = os.environ) -> str:
    """The flag's value, else ``VLLM_SR_LOG_FORMAT``, else auto; anything else is refused."""
    value = log_format if log_format is not None else env.get(LOG_FORMAT_ENV, "auto")
    value = (value or "auto").strip().lower()
    if value not in LOG_FORMATS:
        source = "--log-format" if log_format is not None else LOG_FORMAT_ENV
        raise UsageError(
            f"{source} {value!r} is not a log format; accepted: {', '.join(LOG_FORMATS)}"
        )
    return value


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
    log_format: str | None = None,
) -> logging.Handler:
    """The handler ``setup_logging`` installs; split out so tests can pick the environment.
    ``log_format`` None: ``VLLM_SR_LOG_FORMAT``, else auto."""
    label = f"{replica}: " if replica else ""
    fmt = resolve_log_format(log_format, env)
    if fmt == "json":
        # A worker's stderr is the pipe its supervisor copies through (keeping the last lines
        # for the exit reason), so worker lines travel there; the service's go to stdout.
        stream = sys.stderr if component == "worker" else sys.stdout
        json_handler = logging.StreamHandler(stream)
        json_handler.setFormatter(JsonFormatter(component, replica))
        return json_handler
    if fmt in ("auto", "journald") and (under_systemd(env) or fmt == "journald"):
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


def setup_logging(
    component: str,
    replica: str | None = None,
    level: int = logging.INFO,
    log_format: str | None = None,
) -> None:
    """Configure the root logger once for this process (replaces any earlier handlers).
    ``log_format`` (auto, text, json, journald) None: ``VLLM_SR_LOG_FORMAT``, else auto."""
    root = logging.getLogger()
    root.handlers[:] = [make_handler(component, replica, log_format=log_format)]
    root.setLevel(level)
