"""Host settings (``/etc/vllm-sr/vllm-sr.toml``): where the service listens and keeps its files.

Apart from config.yaml because they belong to the host, not to the model deployment: a package
upgrade or ``vllm-sr config apply`` never rewrites them. Every key is optional; ``vllm-sr serve``
flags (``--listen``, ``--control-socket``, ``--runtime-dir`` ...) override the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import tomlkit
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tomlkit.exceptions import ParseError

from vllm_sr.errors import ConfigError
from vllm_sr.jsontypes import JsonObject

DEFAULT_SERVICE_CONFIG_PATH = Path("/etc/vllm-sr/vllm-sr.toml")
_LISTEN_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")


class ServiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    listen: str = "127.0.0.1:8080"
    """Frontend HTTP address, HOST:PORT ([v6]:PORT for IPv6). Loopback by default: expose it
    on purpose."""

    max_connections: int = Field(default=4096, ge=1, le=1_000_000)
    """Open client connections the frontend holds at once; one past it is answered 503 and
    closed, so a flood of idle connections cannot take the file descriptors that worker
    restarts and the control socket need (keep it well under LimitNOFILE)."""

    control_socket: Path = Path("/run/vllm-sr/control.sock")
    """Unix socket of the control API (vllm-sr ctl, vllm-sr-top)."""

    control_group: str | None = "vllm-sr"
    """Group that owns the control socket (mode 0660); members may read and act. None: the
    service user's primary group."""

    admin_group: str | None = None
    """Group that may also mutate (drain, eject, scale); unset: root and the service user only."""

    runtime_dir: Path = Path("/run/vllm-sr")
    """Sockets and pid files; workers listen on <runtime_dir>/workers/<replica>.sock."""

    state_dir: Path = Path("/var/lib/vllm-sr")
    """Persistent state (learned thread counts, last good config)."""

    artifacts_dir: Path = Path("/var/lib/vllm-sr/artifacts")
    """Models installed offline: artifact vllm-sr/NAME loads the Hugging Face model directory
    NAME here (copy it in; nothing is fetched at run time). Workers get it as
    VLLM_SR_ARTIFACTS_DIR."""

    log_format: Literal["auto", "text", "json", "journald"] = "auto"
    """auto: journald fields under systemd, text on a terminal."""

    ready_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    """How long a worker may take to load and pass its golden check before it counts failed."""

    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600)
    """How long a retiring worker may finish its requests before SIGTERM."""

    stop_grace_s: float = Field(default=10.0, ge=0, le=600)
    """SIGTERM to SIGKILL grace for a worker."""

    config_watch: bool = True
    """Watch config.yaml and apply a change without a signal (an edit, a rename over it, a
    Kubernetes ConfigMap update), through the same reload as SIGHUP; `serve
    --no-config-watch` turns it off."""

    config_watch_settle_s: float = Field(default=2.0, gt=0, le=600)
    """How long a changed config.yaml must stay unchanged before it is read: a writer that
    pauses for less mid-write is never read half-way."""
    signal_processes: int | Literal["auto"] = "auto"
    """Router mode: processes that evaluate the CPU-bound signals (language, structure,
    context, conversation, metadata, keywords, PII) off the frontend's event loop. auto: half
    the CPU budget, 1..4; 0: none, they run on the loop; else 1..64."""

    @field_validator("signal_processes")
    @classmethod
    def _signal_processes(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 0 <= v <= 64:
            raise ValueError(f"{v} is out of range; accepted: auto, or 0..64 (0: on the loop)")
        return v

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        m = _LISTEN_RE.match(v)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise ValueError(f"{v!r} is not HOST:PORT; accepted: e.g. 127.0.0.1:8080 or [::1]:8080")
        return v

    @property
    def workers_dir(self) -> Path:
        return self.runtime_dir / "workers"

    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


def _problems(exc: ValidationError, source: str) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            accepted = ", ".join(ServiceSettings.model_fields)
            out.append(f"{source}: {key}: unknown key; accepted: {accepted}")
        else:
            out.append(f"{source}: {key}: {err.get('input')!r}: {err['msg']}")
    return out


def load_service_settings(
    path: Path | str | None = None, overrides: JsonObject | None = None
) -> ServiceSettings:
    """Settings from the TOML file (``None`` = the default path, which may be missing: then all
    defaults), then ``overrides`` (flag values; ``None`` values are ignored). An explicitly
    given path that does not exist is an error."""
    explicit = path is not None
    p = Path(path) if path is not None else DEFAULT_SERVICE_CONFIG_PATH
    data: JsonObject = {}
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        if explicit:
            raise ConfigError(
                f"--service-config {p}: no such file; accepted: an existing TOML file, or omit the "
                f"flag to use {DEFAULT_SERVICE_CONFIG_PATH} (all defaults when absent)"
            ) from exc
        text = ""
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    if text:
        try:
            data = tomlkit.parse(text).unwrap()
        except ParseError as exc:
            raise ConfigError(f"{p}:{exc.line}: TOML syntax: {exc}") from exc
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return ServiceSettings.model_validate(data)
    except ValidationError as exc:
        problems = _problems(exc, str(p))
        raise ConfigError(f"{p}: {len(problems)} problem(s)", problems) from exc


def default_service_toml() -> str:
    """A commented TOML file listing every key with its default (for packaging and docs)."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment("vllm-sr host settings; every key is optional."))
    for name, field in ServiceSettings.model_fields.items():
        value = field.default
        if field.description:
            doc.add(tomlkit.comment(field.description.replace("\n", " ")))
        if value is None:
            doc.add(tomlkit.comment(f'{name} = "..."'))
        else:
            doc.add(name, str(value) if isinstance(value, Path) else value)
    return tomlkit.dumps(doc)
