"""The routing preview's own limits, ``global.services.api.routing_preview`` (upstream v0.4):
``request_timeout_seconds`` (default 120) bounds one preview, answered 504 ``REQUEST_TIMEOUT``
in the preview's error document when it runs out; ``max_concurrency`` (default 16) bounds the
previews evaluated at once, one more answered 429 ``TOO_MANY_REQUESTS`` at once (it does not
queue). Both paths (``/api/v1/eval`` and ``/api/v1/routing/preview``) share one gate per
router generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from vllm_sr.router.eval import EvalError

if TYPE_CHECKING:
    from vllm_sr.config.schema import GlobalSection

DEFAULT_TIMEOUT_S = 120
DEFAULT_MAX_CONCURRENCY = 16

T = TypeVar("T")


class PreviewTimedOut(EvalError):
    http_status = 504


class PreviewBusy(EvalError):
    http_status = 429
    retryable = True


class PreviewGate:
    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.in_flight = 0

    @classmethod
    def of(cls, global_: GlobalSection | None) -> PreviewGate:
        limits = global_.services.api.routing_preview if global_ is not None else None
        if limits is None:
            return cls()
        return cls(
            limits.request_timeout_seconds or DEFAULT_TIMEOUT_S,
            limits.max_concurrency or DEFAULT_MAX_CONCURRENCY,
        )

    async def run(self, preview: Awaitable[T]) -> T:
        """``preview`` within the limits; raises :class:`PreviewBusy` (and closes it unrun)
        or :class:`PreviewTimedOut` (it is cancelled)."""
        if self.in_flight >= self.max_concurrency:
            if asyncio.iscoroutine(preview):
                preview.close()
            raise PreviewBusy(
                "TOO_MANY_REQUESTS",
                f"{self.in_flight} routing previews in flight; accepted: at most "
                f"{self.max_concurrency} (global.services.api.routing_preview.max_concurrency)",
            )
        self.in_flight += 1
        try:
            return await asyncio.wait_for(preview, self.timeout_s)
        except TimeoutError:
            raise PreviewTimedOut(
                "REQUEST_TIMEOUT",
                f"the routing preview took longer than {self.timeout_s:g} s "
                "(global.services.api.routing_preview.request_timeout_seconds)",
            ) from None
        finally:
            self.in_flight -= 1
