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
