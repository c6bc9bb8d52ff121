"""The one name for a JSON-shaped document passed between modules (inventory entries, /health
bodies, control answers): ``JsonObject``. Values are ``object``, not ``Any``: a reader narrows
what it takes out (``isinstance``, or the helpers below) instead of trusting a shape that a
worker, a config file or an older service may not keep."""

from __future__ import annotations

JsonObject = dict[str, object]


def json_object(value: object) -> JsonObject | None:
    """``value`` when it is a JSON object (a dict), else None."""
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    return None


def json_str(value: object) -> str | None:
    """``value`` when it is a string, else None."""
    return value if isinstance(value, str) else None


def json_int(value: object) -> int | None:
    """``value`` when it is an integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for errors that say what was sent."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
