"""Router mode in a test, without the frontend's pools: a ``ChatRouter`` built on stand-in
backends (a :class:`~tests.support.backends.FakeWorkerExchange` answering its routing
exchanges), its routes (and any others: the Responses API's) served by our HTTP server on
127.0.0.1 with the frontend's own dispatch (``vllm_sr.httpserver.answer``: an unknown path or
method is the JSON 404 / 405), and the official openai SDK's clients for it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.support.backends import FakeWorkerExchange, StandInBackend
from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.routing import Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.httpserver import Handler, HttpServer, PathRoutes, Request, Response, StreamResponse
from vllm_sr.httpserver import answer as answer_route
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import ChatRouter, build_chat_router

AUTO = "vllm-sr/auto"


def providers_on(*backends: StandInBackend, default: str | None = None) -> Providers:
    """Each stand-in the one backend of the model of its name; ``default`` (else the first) is
    the default model."""
    return Providers.model_validate(
        {
            "defaults": {"default_model": default or backends[0].name},
            "models": [
                {"name": b.name, "backend_refs": [{"endpoint": b.endpoint}]} for b in backends
            ],
        }
    )


async def start_router(
    providers: Providers,
    routing: Routing,
    *,
    exchange: FakeWorkerExchange | None = None,
    auto_model_names: tuple[str, ...] = (AUTO,),
    clock: Clock = SYSTEM_CLOCK,
    health_checks: bool = False,
    **build: Any,
) -> ChatRouter:
    """The providers' backends started (health checks off unless asked for) and the router
    built on them, deciding on deployment ``primary``; ``build``: the rest of
    ``build_chat_router``'s arguments. Close with ``await chat.backends.close()``."""
    backends = BackendSet(providers, clock)
    await backends.start(health_checks=health_checks)
    return build_chat_router(
        providers,
        routing,
        exchange=exchange if exchange is not None else FakeWorkerExchange({"primary"}),
        decision_deployment="primary",
        auto_model_names=list(auto_model_names),
        backends=backends,
        **build,
    )


@dataclass
class Served:
    server: HttpServer
    url: str  # http://127.0.0.1:PORT
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    def client(
        self, api_key: str = "k", headers: Mapping[str, str] | None = None
    ) -> openai.AsyncOpenAI:
        """An SDK client on this server (no retries: a test sees each answer), closed with it."""
        made = openai.AsyncOpenAI(
            base_url=f"{self.url}/v1",
            api_key=api_key,
            max_retries=0,
            default_headers=dict(headers) if headers else None,
        )
        self.clients.append(made)
        return made

    async def close(self) -> None:
        for made in self.clients:
            await made.close()
        await self.server.close(5.0)


async def serve_routes(
    routes: Mapping[str, Mapping[str, Handler]],
    *,
    port: int = 0,
    cancel_on_disconnect: bool = True,
) -> Served:
    """``routes`` (path -> method -> handler; ``{name}`` segments allowed) on 127.0.0.1:``port``
    (0: a free one), a caller that hangs up cancelling its request as on the frontend unless
    ``cancel_on_disconnect`` is False."""
    paths = PathRoutes(routes)

    async def handle(request: Request) -> Response | StreamResponse:
        return await answer_route(paths, request)

    server = HttpServer(
        handle, max_body=1 << 20, read_timeout_s=30, cancel_on_disconnect=cancel_on_disconnect
    )
    _, bound = await server.listen_tcp("127.0.0.1", port)
    return Served(server, f"http://127.0.0.1:{bound}")


@dataclass
class RoutedStandIns:
    """A router on stand-in backends, served: see :func:`routed_stand_ins`."""

    backends: dict[str, StandInBackend]  # by model name, in the providers' order
    chat: ChatRouter
    served: Served


@contextlib.asynccontextmanager
async def routed_stand_ins(
    names: tuple[str, ...], routing: Routing, *, default: str | None = None
) -> AsyncIterator[RoutedStandIns]:
    """One stand-in backend per name (:func:`providers_on`: the model of that name; ``default``,
    else the first, the default model), the router on them and its routes served; all of it
    stopped afterwards."""
    backends = [await StandInBackend(n).start() for n in names]
    chat = await start_router(providers_on(*backends, default=default), routing)
    served = await serve_routes(chat.routes())
    try:
        yield RoutedStandIns({b.name: b for b in backends}, chat, served)
    finally:
        await served.close()
        await chat.backends.close()
        for b in backends:
            await b.stop()
