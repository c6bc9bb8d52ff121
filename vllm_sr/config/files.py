"""config.yaml on disk: read with line numbers, report every problem at once, write back
round-trip (comments, key order and unknown-to-us formatting survive) and atomically.

ruamel.yaml's round-trip loader keeps each mapping key's and sequence item's line, which is
how a pydantic error location becomes ``config.yaml:12: global....device: ...``.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from vllm_sr.config.problems import REFUSED_VALUE, SEMANTIC_ERROR, Problem, format_path
from vllm_sr.config.routing_base import RULES_RUN_BY_CALLER
from vllm_sr.config.schema import RootConfig, semantic_problems
from vllm_sr.errors import ConfigError
from vllm_sr.jsontypes import JsonObject

DEFAULT_CONFIG_PATH = Path("/etc/vllm-sr/config.yaml")

# Used when the config file does not exist yet: d3-edge on one CPU worker, Engine mode.
EMBEDDED_DEFAULT_YAML = """\
# vllm-sr canonical resource. `vllm-sr config apply` and `vllm-sr serve` flags rewrite
# `replicas`, `engine_args`, `threads`, `artifact` and `router.enabled`; the rest is yours.
global:
  router:
    enabled: false
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: vllm-sr/d3-edge
        replicas:
          - device: cpu
    system:
      decision_model:
        deployment: primary
"""


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 100
    return y


def parse_document(text: str, source: str = "config.yaml") -> object:
    """YAML text -> round-trip document; a syntax error becomes a one-problem ConfigError."""
    try:
        loaded = _yaml().load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = f"{source}{line}: YAML syntax: {exc.problem or exc.context}"
        raise ConfigError(problem, [problem]) from exc
    except Exception as exc:  # ruamel raises a handful of non-marked errors (duplicate keys)
        problem = f"{source}: YAML: {exc}"
        raise ConfigError(problem, [problem]) from exc
    doc: object = loaded
    return doc


def to_plain(node: object) -> object:
    """Round-trip document -> plain dicts/lists (what pydantic validates)."""
    if isinstance(node, dict):
        return {str(k) if not isinstance(k, str) else k: to_plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [to_plain(v) for v in node]
    return node


def line_of(doc: object, path: tuple[str | int, ...]) -> int | None:
    """1-based line of the deepest node of ``path`` that exists in ``doc``."""
    line: int | None = None
    node = doc
    for part in path:
        try:
            if isinstance(node, CommentedMap) and part in node:
                line = node.lc.key(part)[0] + 1
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
                line = node.lc.item(part)[0] + 1
                node = node[part]
            else:
                break
        except (KeyError, IndexError, TypeError):
            break
    if line is None and isinstance(doc, CommentedMap):
        line = doc.lc.line + 1
    return line


def _accepted(err: ErrorDetails, loc: tuple[str | int, ...]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    number = _number_word(loc)
    bounds = {
        "greater_than_equal": number + " >= {ge}",
        "greater_than": number + " > {gt}",
        "less_than_equal": number + " <= {le}",
        "less_than": number + " < {lt}",
        "too_short": "at least {min_length} item(s)",
        "too_long": "at most {max_length} item(s)",
        "string_too_short": "a non-empty string",
        "string_too_long": "at most {max_length} characters",
        "literal_error": "{expected}",
    }
    if kind in bounds:
        try:
            return bounds[kind].format(**ctx)
        except KeyError:
            return err["msg"]
    simple = {
        "int_parsing": "an integer",
        "int_type": "an integer",
        "int_from_float": "an integer",
        "bool_parsing": "true or false",
        "bool_type": "true or false",
        "string_type": "a string",
        "dict_type": "a mapping",
        "model_type": "a mapping",
        "list_type": "a list",
        "missing": "this key is required",
    }
    return simple.get(kind, err["msg"])


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The schema model whose key ``loc`` ends in (None: a place the schema holds no model)."""
    model: type[BaseModel] | None = RootConfig
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = _field_of(model, part)
        if field is None:  # a dict key (a deployment name): keep the value model
            continue
        model = _model_of(field.annotation)
    return model


def _field_of(model: type[BaseModel] | None, key: str | int) -> FieldInfo | None:
    fields = model.model_fields if model is not None else {}
    return next((f for n, f in fields.items() if key in (n, f.alias)), None)


def _allowed_keys(loc: tuple[str | int, ...]) -> str:
    """For an unknown key: the keys the schema accepts at that place."""
    model = _model_at(loc)
    if model is None:
        return "no keys here"
    names = [f.alias or n for n, f in model.model_fields.items()]
    return ", ".join(names)


def _number_word(loc: tuple[str | int, ...]) -> str:
    """How a bound names what it bounds: "an integer" for an int field, "a number" for a float
    one (whatever the bound's own type: ``Field(ge=0)`` on a float) or a field not found."""
    from typing import get_args

    field = _field_of(_model_at(loc), loc[-1]) if loc else None
    if field is None:
        return "a number"
    kinds = [a for a in get_args(field.annotation) if a is not type(None)] or [field.annotation]
    return "an integer" if all(k is int for k in kinds) else "a number"


def _model_of(annotation: object) -> type[BaseModel] | None:
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _problem_from_error(err: ErrorDetails) -> Problem:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        return Problem(loc, f"unknown key {loc[-1]!r}; accepted: {_allowed_keys(loc)}")
    if kind == "missing":
        return Problem(loc, "missing; this key is required")
    if kind in ("device_grammar", "endpoint_grammar", REFUSED_VALUE):
        return Problem(loc, err["msg"])
    shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return Problem(loc, f"{shown} is not accepted; accepted: {_accepted(err, loc)}")


def collect_problems(data: object) -> tuple[RootConfig | None, list[Problem]]:
    """Validate a plain mapping; every problem, field errors and rule errors alike. The rules
    (``semantic_problems``) run once, here on the raw mapping, so that a file with field errors
    gets its rule errors too; the model's own run of them is switched off for this call."""
    problems: list[Problem] = []
    config: RootConfig | None = None
    try:
        config = RootConfig.model_validate(data, context={RULES_RUN_BY_CALLER: True})
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            if err["type"] == SEMANTIC_ERROR:
                continue  # rule checks: semantic_problems reports them with exact paths
            problems.append(_problem_from_error(err))
    if not isinstance(data, dict):
        problems = [Problem((), "the file must hold a mapping with the key 'global'")]
    problems += semantic_problems(data)
    return (config if not problems else None), problems


def render_problem(source: str, doc: object, problem: Problem) -> str:
    line = line_of(doc, problem.path)
    where = f"{source}:{line}" if line is not None else source
    return f"{where}: {format_path(problem.path)}: {problem.message}"


def parse_config(text: str, source: str = "config.yaml") -> RootConfig:
    """YAML text -> RootConfig, or ConfigError listing every problem with its line."""
    doc = parse_document(text, source)
    config, problems = collect_problems(to_plain(doc) if doc is not None else None)
    if problems or config is None:
        ordered = sorted(problems, key=lambda p: line_of(doc, p.path) or 0)
        rendered = [render_problem(source, doc, p) for p in ordered] or [
            f"{source}: empty file; accepted: a mapping with the key 'global'"
        ]
        raise ConfigError(f"{source}: {len(rendered)} problem(s)", rendered)
    return config


def read_config_text(path: Path | str) -> tuple[str, bool]:
    """(text, existed): the file's text, or the embedded default when it does not exist."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8"), True
    except FileNotFoundError:
        return EMBEDDED_DEFAULT_YAML, False
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}); accepted: UTF-8 YAML") from exc


def load_config(path: Path | str = DEFAULT_CONFIG_PATH) -> RootConfig:
    """The validated config at ``path``; the embedded default when the file does not exist."""
    text, _ = read_config_text(path)
    return parse_config(text, str(path))


def dump_document(doc: object) -> str:
    buf = io.StringIO()
    _yaml().dump(doc, buf)
    return buf.getvalue()


def atomic_write(path: Path | str, text: str, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, fsync, then rename over ``path``: a reader
    (or a crash) sees the old file or the new one, never half of one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        mode = p.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dfd = os.open(p.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@contextlib.contextmanager
def directory_lock(directory: Path, exclusive: bool = True) -> Iterator[None]:
    """Serialize read-modify-write cycles of config.yaml (an operator's apply against the
    control API's scale). The lock is on the directory: the file itself is replaced by rename."""
    if not exclusive:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def effective_dict(config: RootConfig) -> JsonObject:
    """The config with every default filled in (``config show``); the one-worker shorthand is
    shown as the canonical one-item ``replicas`` it means."""
    data = config.model_dump(by_alias=True, mode="json")
    for name, dep in config.deployments.items():
        out = data["global"]["model_catalog"]["deployments"][name]
        for key in ("device", "endpoint", "model"):
            out.pop(key, None)
        out["replicas"] = [r.model_dump(exclude_none=True) for r in dep.effective_replicas()]
    return data
