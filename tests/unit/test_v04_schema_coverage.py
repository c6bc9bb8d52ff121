"""Every field of upstream v0.4's JSON schema (tests/fixtures/upstream/v0.4) against vllm-sr's
config models: a v0.4 field with no field in our model at that place is an "unknown key" here,
neither read nor refused by name. Each (schema definition, our model) pair is walked once, so a
gap is listed at the first path that reaches it. A place where our model holds an untyped block
(dict / Any) is not walked further: the block is accepted or refused as a whole."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from vllm_sr.config.schema import RootConfig

SCHEMA = (
    Path(__file__).resolve().parents[1] / "fixtures/upstream/v0.4/router-config-v0.3.schema.json"
)
# v0.4 fields neither read nor refused: 0 since v04-plugins merged onto v04-surface's line
# (2026-12-05: 73, less v04-surface's 21 routing fields, less v04-plugins' 52); the test
# below asserts there are none, so a new v0.4 field must be read or refused.
KNOWN_GAPS = 0


def _models_in(ann: Any) -> list[type[BaseModel]]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    if get_origin(ann) in (Union, types.UnionType, typing.Annotated):
        return [m for a in get_args(ann) for m in _models_in(a)]
    return []


def _inner(ann: Any, kind: str) -> list[Any]:
    origin = get_origin(ann)
    if origin in (Union, types.UnionType, typing.Annotated):
        return [x for a in get_args(ann) for x in _inner(a, kind)]
    if kind == "items" and origin in (list, tuple, set, frozenset):
        return [a for a in get_args(ann) if a is not Ellipsis]
    if kind == "map" and origin is dict:
        return [get_args(ann)[1]]
    return []


def unread_fields(schema: dict[str, Any], root: type[BaseModel] = RootConfig) -> list[str]:
    """The schema's property paths that ``root`` has no field for (by name or alias)."""
    defs = schema.get("$defs", {})
    missing: list[str] = []
    seen: set[tuple[str, str]] = set()

    def field(model: type[BaseModel], key: str) -> Any:
        return next((f for n, f in model.model_fields.items() if key in (n, f.alias)), None)

    def walk(node: dict[str, Any], anns: list[Any], path: str) -> None:
        if not anns:
            return
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            key = (name, repr(anns))
            if key not in seen:
                seen.add(key)
                walk(defs[name], anns, path)
        for branch in ("oneOf", "anyOf", "allOf"):
            for sub in node.get(branch, []):
                walk(sub, anns, path)
        for branch in ("then", "else"):
            if isinstance(node.get(branch), dict):
                walk(node[branch], anns, path)
        if "properties" in node:
            models = [m for a in anns for m in _models_in(a)]
            for prop, sub in node["properties"].items() if models else ():
                here = f"{path}.{prop}" if path else prop
                fields = [f for m in models if (f := field(m, prop)) is not None]
                if not fields:
                    missing.append(here)
                else:
                    walk(sub, [f.annotation for f in fields], here)
        if isinstance(node.get("items"), dict):
            walk(node["items"], [x for a in anns for x in _inner(a, "items")], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            inner = [x for a in anns for x in _inner(a, "map")]
            walk(node["additionalProperties"], inner, f"{path}{{}}")

    walk({"properties": schema["properties"]}, [root], "")
    return sorted(set(missing))


def test_the_walk_finds_a_field_we_lack_and_passes_renamed_ones() -> None:
    schema = {
        "properties": {"providers": {"$ref": "#/$defs/P"}},
        "$defs": {
            "P": {"properties": {"defaults": {"$ref": "#/$defs/D"}}},
            "D": {"properties": {"model": {"type": "string"}, "bogus": {"type": "string"}}},
        },
    }
    assert unread_fields(schema) == ["providers.defaults.bogus"]


def test_every_v04_schema_field_is_read_or_refused() -> None:
    gaps = unread_fields(json.loads(SCHEMA.read_text(encoding="utf-8")))
    assert len(gaps) == KNOWN_GAPS, f"{len(gaps)} unread v0.4 fields:\n" + "\n".join(gaps)
