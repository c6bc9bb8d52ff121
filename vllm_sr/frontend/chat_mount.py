"""Router mode on the frontend: ``/v1/chat/completions`` for the current config generation.

Each generation's ``RouterPlan`` (from config.yaml: providers, routing, auto model names) builds
a ``ChatRouter`` (``vllm_sr/router``) whose questions go through the deployments' pools as
``routing`` exchanges, on the same admission and per-worker accounting as native requests. A
reload that changes only signals or decisions builds a new router and keeps every worker and
the backends (and the decision counters); a change of providers starts new backends and closes
the old ones after the swap. Engine mode (``-e``) answers chat with a typed 404.

A generation's router is built when its plan is published, never on a user's request: the
supervisor calls :meth:`ChatMount.build` (backends, the replay store's connect, the chat
router, the language models) before it publishes a generation, :meth:`ChatMount.swap` in the
same step as the pools' publish (no await: a chat sees the old generation or the new one
whole), then :meth:`ChatMount.retire` closes what the old router held and the new one does not
share once the chats in flight on it have finished.

Importing this module loads no router: the router (and what it pulls in: numpy, the signal
models' code) is imported when a generation turns Router mode on, so that Engine mode and the
supervisor, which hold a ``ChatMount`` from the start, never pay for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr import heap
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

__all__ = ["ChatMount", "NoProviders", "RetiredRouter", "RouterPlan", "StagedRouter"]

log = logging.getLogger("vllm_sr.frontend")


class NoProviders(NotFound):
    code = "no_providers"


class ResponsesOff(NotFound):
    code = "responses_api_off"


@dataclass
class StagedRouter:
    """A generation's Router mode, built and not yet serving (:meth:`ChatMount.build`; then
    :meth:`ChatMount.swap` puts it in service, or :meth:`ChatMount.discard` drops it)."""

    plan: RouterPlan | None
    chat: ChatRouter | None = None
    backends: BackendSet | None = None
    responses: ResponsesAPI | None = None
    responses_conf: ResponseAPI | None = None
    unchanged: bool = False  # the plan is the one serving: swapping it changes nothing


@dataclass
class RetiredRouter:
    """What a swap took out of service: the old chat router (its chats in flight finish on
    it) and what the new generation does not share, closed by :meth:`ChatMount.retire`."""

    chat: ChatRouter | None = None
    closing: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


class InFlight:
    """The chats in flight on one chat router; ``idle`` waits until there are none."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        self.count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._idle.set()

    async def idle(self, timeout_s: float) -> bool:
        """True once no chat is in flight; False when ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class ChatMount:
    def __init__(self, directory: PoolDirectory, *, retire_grace_s: float = 30.0) -> None:
        self.directory = directory
        self.plan: RouterPlan | None = None
        self.chat: ChatRouter | None = None
        self._backends: BackendSet | None = None
        self._warm: asyncio.Task[None] | None = None
        # The Responses API (global.services.response_api); its store lives as long as its
        # settings do, across reloads.
        self.responses: ResponsesAPI | None = None
        self._responses_conf: ResponseAPI | None = None
        # Chats in flight per chat router: a retired router's resources close once its chats
        # have finished (or after ``retire_grace_s``).
        self.retire_grace_s = retire_grace_s
        self._inflight: dict[ChatRouter, InFlight] = {}
        # The signal processes' dispatch (the supervisor's), when it runs some.
        self.signal_dispatch: SignalDispatch | None = None

    def use_signal_dispatch(self, dispatch: SignalDispatch) -> None:
        """Hand the CPU-bound signals to the signal processes, from this generation on."""
        self.signal_dispatch = dispatch
        if self.chat is not None:
            for router in self.chat.recipes.values():
                router.signal_step.dispatch = dispatch

    async def update(self, plan: RouterPlan | None) -> None:
        """Take a generation's router settings: build, swap, retire (the supervisor does the
        three apart, the swap in the same step as the pools' publish)."""
        staged = await self.build(plan)
        await self.retire(self.swap(staged))

    async def build(self, plan: RouterPlan | None) -> StagedRouter:
        """Build a generation's Router mode without touching the one serving: new backends,
        the replay store's connect (bounded), the chat router and what it loads in this
        process (the language models, off the loop), the Responses API's store. What did not
        change is shared (backends, response cache, replay log, counters)."""
        if plan == self.plan:
            return StagedRouter(plan, self.chat, self._backends, self.responses,
                                self._responses_conf, unchanged=True)  # fmt: skip
        staged = StagedRouter(plan)
        if plan is not None and plan.enabled and plan.providers is not None:
            staged.chat, staged.backends = await self._build_chat(plan)
        conf = _responses_of(plan) if staged.chat is not None else None
        staged.responses_conf = conf
        if conf == self._responses_conf:
            staged.responses = self.responses
        elif conf is not None:
            from vllm_sr.router.responses.api import ResponsesAPI, build_store

            staged.responses = ResponsesAPI(build_store(conf))
        return staged

    async def _build_chat(self, plan: RouterPlan) -> tuple[ChatRouter, BackendSet]:
        from vllm_sr.config.routing import Routing
        from vllm_sr.router.backends import BackendSet
        from vllm_sr.router.chat import build_chat_router

        assert plan.providers is not None
        same_providers = self.plan is not None and self.plan.providers == plan.providers
        backends = self._backends if same_providers else None
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
        chat = build_chat_router(
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
        chat.config_hash = plan.config_hash
        for router in chat.recipes.values():
            # The language models load in seconds: here, before the router serves.
            await asyncio.to_thread(router.deterministic.warm)
        return chat, backends

    def swap(self, staged: StagedRouter) -> RetiredRouter:
        """Put a built generation in service in one step (no await): chats that arrive from
        now on run on it; those in flight finish on the old one. -> what to retire."""
        if staged.unchanged:
            return RetiredRouter()
        old_chat, old_backends, old_responses = self.chat, self._backends, self.responses
        self.plan, self.chat, self._backends = staged.plan, staged.chat, staged.backends
        self.responses, self._responses_conf = staged.responses, staged.responses_conf
        retired = RetiredRouter(old_chat)
        if old_chat is not None:
            retired.closing.append(old_chat.shadow.close)
            new = staged.chat
            if old_chat.cache is not None and (new is None or new.cache is not old_chat.cache):
                retired.closing.append(old_chat.cache.store.close)
            if new is None:
                retired.closing.append(old_chat.learning.state.close)
            else:
                retired.closing.append(new.learning.state.close_retired)
            if new is None or new.replay is not old_chat.replay:
                retired.closing.append(old_chat.replay.close)
        if old_backends is not None and old_backends is not self._backends:
            retired.closing.append(old_backends.close)
        if old_responses is not None and old_responses is not self.responses:
            retired.closing.append(old_responses.store.close)
        if self._warm is not None:
            self._warm.cancel()  # it warmed a router no chat reaches any more
            self._warm = None
        if self.chat is not None:
            self._warm = asyncio.ensure_future(self._warm_up(self.chat))
        return retired

    async def retire(self, retired: RetiredRouter) -> None:
        """Close what a swap took out of service once the old router's chats in flight have
        finished (at most ``retire_grace_s``)."""
        if retired.chat is not None:
            inflight = self._inflight.get(retired.chat)
            if inflight is not None and not await inflight.idle(self.retire_grace_s):
                log.warning(
                    "%d chats still in flight on the retired router after %.0f s; closing it",
                    inflight.count,
                    self.retire_grace_s,
                )
            self._inflight.pop(retired.chat, None)
        for close in retired.closing:
            await close()

    async def discard(self, staged: StagedRouter) -> None:
        """Drop a built generation that was never swapped in (a reload that failed after its
        build): close what it made that the serving one does not share."""
        if staged.unchanged:
            return
        chat = staged.chat
        if chat is not None and self.chat is not chat:
            live = self.chat
            if chat.cache is not None and (live is None or live.cache is not chat.cache):
                await chat.cache.store.close()
            if live is None or live.replay is not chat.replay:
                await chat.replay.close()
        if staged.backends is not None and staged.backends is not self._backends:
            await staged.backends.close()
        if staged.responses is not None and staged.responses is not self.responses:
            await staged.responses.store.close()

    def _entered(self, chat: ChatRouter) -> contextlib.AbstractContextManager[None]:
        inflight = self._inflight.get(chat)
        if inflight is None:
            inflight = self._inflight[chat] = InFlight()
        return inflight.entered()

    async def _warm_up(self, chat: ChatRouter) -> None:
        """Candidate and example embeddings for this generation, asked once (the first chat
        asks for them itself when the decision deployment is not ready yet); then the heap
        is settled (vllm_sr/vllm_sr/heap.py: one full collection now, none later over what
        the generation holds)."""
        for router in chat.recipes.values():
            with contextlib.suppress(VllmSrError):
                await router.warm()
        settled = heap.settle()
        log.info(
            "router heap settled: %d objects frozen, %d collected, %.0f ms",
            settled.frozen,
            settled.collected,
            settled.ms,
        )

    async def close(self) -> None:
        if self._warm is not None:
            self._warm.cancel()
        if self.responses is not None:
            await self.responses.store.close()
            self.responses, self._responses_conf = None, None
        if self.chat is not None:
            await self.chat.shadow.close()
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
        chat = self.chat
        with self._entered(chat):
            return await chat.handle_chat(request)

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
        chat, responses = self.chat, self.responses
        with self._entered(chat):
            if op == "create":
                return await responses.create(request, chat.handle_chat)
            handler = {
                "retrieve": responses.retrieve,
                "delete": responses.delete,
                "input_items": responses.input_items,
            }[op]
            return await handler(request)

    async def handle_eval(self, request: Request) -> Response:
        """``/api/v1/eval`` and ``/api/v1/routing/preview``: Router mode's routing preview (no
        backend is called)."""
        if self.plan is None or not self.plan.enabled:
            return error_response(EngineMode.at(request.path))
        if self.chat is None:
            return error_response(NoProviders("routing needs providers: (docs/router.md)"))
        chat = self.chat
        with self._entered(chat):
            return await chat.handle_eval(request)

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
