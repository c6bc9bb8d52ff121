"""Router mode on the frontend: ``/v1/chat/completions`` for the current config generation.

Each generation's ``RouterPlan`` (from config.yaml: providers, routing, auto model names) builds
a ``ChatRouter`` (``vllm_sr/router``) whose questions go through the deployments' pools as
``routing`` exchanges, on the same admission and per-worker accounting as native requests. A
reload that changes only signals or decisions builds a new router and keeps every worker and
the backends (and the decision counters); a change of providers starts new backends and closes
the old ones after the swap. Engine mode (``-e``) answers chat with a typed 404.

Importing this module loads no router: the router (and what it pulls in: numpy, the signal
models' code) is imported when a generation turns Router mode on, so that Engine mode and the
supervisor, which hold a ``ChatMount`` from the start, never pay for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from vllm_sr.errors import EngineMode, NotFound, Unavailable, VllmSrError
from vllm_sr.httpserver import Request, Response, StreamResponse, error_response
from vllm_sr.jsontypes import JsonObject
from vllm_sr.plan import RouterPlan
from vllm_sr.pool.directory import PoolDirectory
from vllm_sr.pool.exchange import routing_exchange

if TYPE_CHECKING:
    from vllm_sr.config.upstream_global import ResponseAPI
    from vllm_sr.router.backends import BackendSet
    from vllm_sr.router.chat import ChatRouter
    from vllm_sr.router.plugins.replay import ReplayLog
    from vllm_sr.router.responses.api import ResponsesAPI
    from vllm_sr.router.signal_dispatch import SignalDispatch

__all__ = ["ChatMount", "NoProviders", "RouterPlan"]

log = logging.getLogger("vllm_sr.frontend")


class NoProviders(NotFound):
    code = "no_providers"


class ResponsesOff(NotFound):
    code = "responses_api_off"


class ChatMount:
    def __init__(self, directory: PoolDirectory) -> None:
        self.directory = directory
        self.plan: RouterPlan | None = None
        self.chat: ChatRouter | None = None
        self._backends: BackendSet | None = None
        self._warm: asyncio.Task[None] | None = None
        # The Responses API (global.services.response_api); its store lives as long as its
        # settings do, across reloads.
        self.responses: ResponsesAPI | None = None
        self._responses_conf: ResponseAPI | None = None
        # The signal processes' dispatch (the supervisor's), when it runs some.
        self.signal_dispatch: SignalDispatch | None = None

    def use_signal_dispatch(self, dispatch: SignalDispatch) -> None:
        """Hand the CPU-bound signals to the signal processes, from this generation on."""
        self.signal_dispatch = dispatch
        if self.chat is not None:
            for router in self.chat.recipes.values():
                router.signal_dispatch = dispatch

    async def update(self, plan: RouterPlan | None) -> None:
        """Take a generation's router settings; rebuild only what changed."""
        if plan == self.plan:
            return
        old_backends = self._backends
        if plan is None or not plan.enabled or plan.providers is None:
            if self.chat is not None and self.chat.cache is not None:
                await self.chat.cache.store.close()
            if self.chat is not None:
                await self.chat.learning.state.close()
                await self.chat.replay.close()
            self.plan, self.chat, self._backends = plan, None, None
        else:
            from vllm_sr.config.routing import Routing
            from vllm_sr.router.backends import BackendSet
            from vllm_sr.router.chat import build_chat_router

            same_providers = self.plan is not None and self.plan.providers == plan.providers
            backends = old_backends if same_providers and old_backends else None
            if backends is None:
                backends = BackendSet(plan.providers)
                await backends.start()
            # The response cache lives as long as its store settings do (a reload that changes
            # only routing keeps every entry; a decision's policy is in its keys).
            same_store = self.plan is not None and _store_of(self.plan) == _store_of(plan)
            old_cache = self.chat.cache if self.chat is not None else None
            old_replay = self.chat.replay if self.chat is not None else None
            same_replay = self.plan is not None and _replay_of(self.plan) == _replay_of(plan)
            replay = old_replay if same_replay and old_replay is not None else None
            if replay is None:
                replay = await _start_replay(plan)
            self.chat = build_chat_router(
                plan.providers,
                plan.routing or Routing(),
                exchange=routing_exchange(self.directory),
                decision_deployment=plan.decision_deployment,
                auto_model_names=list(plan.auto_model_names),
                backends=backends,
                stats=self.chat.stats if self.chat is not None else None,
                replay=replay,
                learning_state=self.chat.learning.state if self.chat is not None else None,
                authz=plan.authz,
                recipes=plan.recipes,
                entrypoints=plan.entrypoints,
                global_=plan.global_,
                cache=old_cache if same_store and old_cache is not None else True,
                signal_dispatch=self.signal_dispatch,
            )
            if old_cache is not None and old_cache is not self.chat.cache:
                await old_cache.store.close()
            await self.chat.learning.state.close_retired()
            if old_replay is not None and old_replay is not replay:
                await old_replay.close()
            self.plan, self._backends = plan, backends
            self._warm = asyncio.ensure_future(self._warm_up(self.chat))
        if old_backends is not None and old_backends is not self._backends:
            await old_backends.close()
        await self._update_responses(_responses_of(plan) if self.chat is not None else None)

    async def _update_responses(self, conf: ResponseAPI | None) -> None:
        if conf == self._responses_conf:
            return
        old, self.responses, self._responses_conf = self.responses, None, conf
        if conf is not None:
            from vllm_sr.router.responses.api import ResponsesAPI, build_store

            self.responses = ResponsesAPI(build_store(conf))
        if old is not None:
            await old.store.close()

    async def _warm_up(self, chat: ChatRouter) -> None:
        """Candidate and example embeddings for this generation, asked once (the first chat
        asks for them itself when the decision deployment is not ready yet)."""
        for router in chat.recipes.values():
            # The language models load in seconds: here, not on the first chat that asks.
            await asyncio.to_thread(router.deterministic.warm)
            with contextlib.suppress(VllmSrError):
                await router.warm()

    async def close(self) -> None:
        if self._warm is not None:
            self._warm.cancel()
        await self._update_responses(None)
        if self.chat is not None:
            await self.chat.learning.state.close()
        if self.chat is not None and self.chat.cache is not None:
            await self.chat.cache.store.close()
        if self.chat is not None:
            await self.chat.replay.close()
        if self._backends is not None:
            await self._backends.close()

    async def handle_chat(self, request: Request, admitting: bool) -> Response | StreamResponse:
        if not admitting:
            return error_response(Unavailable("the service is stopping", retry_after_s=1.0))
        if self.plan is None or not self.plan.enabled:
            return error_response(EngineMode.at(request.path))
        if self.chat is None:
            return error_response(
                NoProviders(
                    "chat completions need LLM backends: Router mode is on but config.yaml has "
                    "no providers:; accepted: a top-level providers: section (docs/router.md)"
                )
            )
        return await self.chat.handle_chat(request)

    async def handle_responses(
        self, request: Request, admitting: bool, op: str
    ) -> Response | StreamResponse:
        """The Responses API (vllm_sr/router/responses/api.py): ``op`` is ``create``,
        ``retrieve``, ``delete`` or ``input_items``."""
        if op == "create" and not admitting:
            return error_response(Unavailable("the service is stopping", retry_after_s=1.0))
        if self.plan is None or not self.plan.enabled:
            return error_response(EngineMode.at(request.path))
        if self.chat is None or self.responses is None:
            return error_response(
                ResponsesOff(
                    f"{request.path}: the Responses API is not served: config.yaml has no "
                    "global.services.response_api block with enabled: true (and Router mode "
                    "needs providers:); accepted: response_api: {store_backend: memory} or a "
                    "redis store (docs/router.md, The Responses API)"
                )
            )
        if op == "create":
            return await self.responses.create(request, self.chat.handle_chat)
        handler = {
            "retrieve": self.responses.retrieve,
            "delete": self.responses.delete,
            "input_items": self.responses.input_items,
        }[op]
        return await handler(request)

    async def handle_eval(self, request: Request) -> Response:
        """``/api/v1/eval``: Router mode's routing preview (no backend is called)."""
        if self.plan is None or not self.plan.enabled:
            return error_response(EngineMode.at(request.path))
        if self.chat is None:
            return error_response(NoProviders("routing needs providers: (docs/router.md)"))
        return await self.chat.handle_eval(request)

    def models_data(self) -> list[JsonObject]:
        return self.chat.models_data() if self.chat is not None else []

    def inventory(self) -> JsonObject | None:
        if self.chat is None:
            return None
        doc = self.chat.inventory()
        if self.signal_dispatch is not None:
            doc["signal_dispatch"] = self.signal_dispatch.inventory()
        if self.responses is not None:
            doc["responses"] = self.responses.inventory()
        return doc

    async def replay(
        self,
        decision: str | None = None,
        since: int = 0,
        recipe: str | None = None,
        session: str | None = None,
    ) -> JsonObject:
        """router_replay's records (the control API's ``GET /v1/replay``), from its store."""
        if self.chat is None:
            return {"records": [], "last_seq": 0, "decisions": []}
        return await self.chat.replay.read(decision, since, recipe, session)


def _replay_of(plan: RouterPlan) -> object:
    """The plan's router_replay store settings (``enabled`` aside: it is each decision's
    default, read per generation), compared for equality."""
    glob = plan.global_
    return None if glob is None else glob.services.router_replay.model_dump(exclude={"enabled"})


async def _start_replay(plan: RouterPlan) -> ReplayLog:
    """A replay log on the plan's store, tried once (bounded): a store that cannot be reached
    leaves the router serving and is retried later (vllm_sr/router/replay/writer.py)."""
    from vllm_sr.router.plugins.replay import ReplayLog

    glob = plan.global_
    replay = ReplayLog.from_config(None if glob is None else glob.services.router_replay)
    await replay.writer.start()
    return replay


def _responses_of(plan: RouterPlan | None) -> ResponseAPI | None:
    """The plan's Responses API settings when it is served (a written, enabled block)."""
    conf = None if plan is None or plan.global_ is None else plan.global_.services.response_api
    return conf if conf is not None and conf.enabled else None


def _store_of(plan: RouterPlan) -> object:
    """The plan's response-cache store settings (None: the defaults), compared for equality."""
    glob = plan.global_
    return None if glob is None else glob.stores.response_cache
