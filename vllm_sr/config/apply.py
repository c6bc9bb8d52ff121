"""Moved: the flag edits live in :mod:`vllm_sr.placement.apply` (placement owns them; config is
data). This name stays only until the two callers outside the config/placement area import the
new path (``supervisor/service.py``'s ``config_scaler`` and ``tests/integration/test_serve.py``);
it imports nothing at import time, so ``vllm_sr.config`` still pulls in no placement module.
Delete it once those import ``vllm_sr.placement.apply``.
"""

from __future__ import annotations

from typing import Any

_MOVED = ("ApplyResult", "apply_flags", "apply_scale")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from vllm_sr.placement import apply

        return getattr(apply, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
