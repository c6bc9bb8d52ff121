"""Rendered objects -> YAML: one multi-document stream, or one file per object in a directory
(``NN-kind-name.yaml``, numbered in apply order, so ``kubectl apply -f DIR`` applies them in
that order)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.scalarstring import LiteralScalarString

from vllm_sr.errors import UsageError


def _literal(value: Any) -> Any:
    """Multi-line strings (the ConfigMap's files) as YAML block literals, readable as files."""
    if isinstance(value, dict):
        return {k: _literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    if isinstance(value, str) and "\n" in value:
        return LiteralScalarString(value)
    return value


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.default_flow_style = False
    y.width = 4096  # never fold a long annotation or command
    return y


def to_yaml(obj: dict[str, Any]) -> str:
    buf = io.StringIO()
    _yaml().dump(_literal(obj), buf)
    return buf.getvalue()


def to_stream(objs: list[dict[str, Any]]) -> str:
    return "".join(f"---\n{to_yaml(o)}" for o in objs)


def file_name(index: int, obj: dict[str, Any]) -> str:
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def write_dir(objs: list[dict[str, Any]], directory: Path) -> list[Path]:
    """One file per object; refuses a directory holding other YAML (stale objects would be
    applied with the new ones)."""
    names = [file_name(i, o) for i, o in enumerate(objs)]
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--out {directory}: not a directory; accepted: a new or empty directory")
    directory.mkdir(parents=True, exist_ok=True)
    stale = sorted(
        p.name for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.name not in names
    )
    if stale:
        raise UsageError(
            f"--out {directory}: holds other manifests ({', '.join(stale[:5])}); kubectl apply -f "
            "would apply them too; accepted: an empty directory or one written by this command"
        )
    paths = []
    for name, obj in zip(names, objs, strict=True):
        path = directory / name
        path.write_text(to_yaml(obj), encoding="utf-8")
        paths.append(path)
    return paths
