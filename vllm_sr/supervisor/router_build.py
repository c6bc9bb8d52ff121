"""Router mode's part of publishing a generation: the supervisor builds the generation's router
before it publishes the generation (the frontend's ``ChatMount``: backends, the replay store's
connect, the chat router), swaps it in the same step as the pools' publish (no await), and
retires the old one afterwards (its chats in flight finish on it first). So no user's request
ever builds a router, and a router that cannot be built fails the reload (the running
generation keeps serving) instead of a chat.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from vllm_sr.errors import VllmSrError
from vllm_sr.plan import RouterPlan

if TYPE_CHECKING:
    from vllm_sr.frontend.chat_mount import RetiredRouter, StagedRouter

log = logging.getLogger("vllm_sr.supervisor")


class RouterBuilder(Protocol):
    """What the supervisor asks of Router mode when it publishes (``ChatMount``)."""

    async def build(self, plan: RouterPlan | None) -> StagedRouter: ...

    def swap(self, staged: StagedRouter) -> RetiredRouter: ...

    async def retire(self, retired: RetiredRouter) -> None: ...

    async def discard(self, staged: StagedRouter) -> None: ...


async def build_router(builder: RouterBuilder, plan: RouterPlan | None) -> StagedRouter:
    """``builder.build(plan)``; a failure is a ``VllmSrError`` naming what failed."""
    try:
        return await builder.build(plan)
    except VllmSrError:
        raise
    except Exception as exc:
        log.exception("Router mode could not be built")
        raise VllmSrError(f"Router mode could not be built: {type(exc).__name__}: {exc}") from exc
