"""The Responses API's HTTP handlers (upstream's ``req_filter_response_api.go``):

- ``POST /v1/responses``: the request is translated to a chat completion and handed to the
  config generation's ``ChatRouter.handle_chat``, the same path as ``/v1/chat/completions``
  (signals, decision, plugins, backend retries and fallback, answer headers); its answer is
  translated back (a streamed one event by event as it passes) and, unless ``store: false``,
  stored. An error answer (the chat's own, or the backend's) comes back as it is.
- ``GET /v1/responses/{id}``: the stored Response; ``DELETE`` removes it
  (``{"id", "object": "response.deleted", "deleted": true}``);
- ``GET /v1/responses/{id}/input_items``: its input items (the instructions first, as a system
  message), ``{"object": "list", "data", "first_id", "last_id", "has_more": false}``.

An id that is not stored is a 404 ``response_not_found`` naming it; so is a
``previous_response_id`` that is not (the chain is never dropped silently). When an older turn
of the chain is gone (deleted, expired, evicted), the answer says so in
``x-vsr-response-chain-missing`` (that id) and carries the turns still stored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import unquote

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import VllmSrError
from vllm_sr.httpserver import Handler, Request, Response, StreamResponse, error_response
from vllm_sr.jsontypes import JsonObject, json_object
from vllm_sr.router.cache.answer import replay_sse
from vllm_sr.router.responses.events import CONTENT_TYPE, StreamTranslator, translate_whole
from vllm_sr.router.responses.redis_store import RedisResponseStore, redis_client
from vllm_sr.router.responses.store import (
    MemoryStore,
    Record,
    ResponseNotFound,
    ResponseStore,
    chain,
)
from vllm_sr.router.responses.translate import (
    Turn,
    from_chat,
    new_id,
    parse_request,
    to_chat,
)

if TYPE_CHECKING:
    from vllm_sr.config.upstream_global import ResponseAPI
    from vllm_sr.router.chat import ChatRouter

log = logging.getLogger("vllm_sr.router.responses")

H_CHAIN_MISSING = "x-vsr-response-chain-missing"
ChatHandler = Callable[[Request, StreamTranslator | None], Awaitable[Response | StreamResponse]]


def build_store(conf: ResponseAPI, clock: Clock = SYSTEM_CLOCK) -> ResponseStore:
    if conf.backend() == "redis":
        client, prefix = redis_client(conf.redis)
        return RedisResponseStore(client, prefix, conf.ttl_seconds)
    return MemoryStore(ttl_s=conf.ttl_seconds, max_responses=conf.max_responses, clock=clock)


def response_id_of(path: str) -> str:
    """``/v1/responses/{id}`` and ``/v1/responses/{id}/input_items``: the id."""
    return unquote(path.split("/")[3])


class ResponsesAPI:
    """The handlers over one store; the store outlives config generations whose
    ``response_api`` settings are the same."""

    def __init__(self, store: ResponseStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock
        self.stored = 0
        self.store_failures = 0

    def inventory(self) -> JsonObject:
        """For the inventory's ``router.responses``: the store and its counters."""
        return {
            "store": self.store.kind,
            "entries": self.store.usage(),
            "stored": self.stored,
            "store_failures": self.store_failures,
        }

    def routes(self, chat: Callable[[], ChatRouter]) -> dict[str, dict[str, Handler]]:
        """Path templates (``httpserver.PathRoutes``) for a server of its own (tests);
        ``chat`` gives the current generation's router."""

        async def create(request: Request) -> Response | StreamResponse:
            return await self.create(request, chat().handle_chat)

        return {
            "/v1/responses": {"POST": create},
            "/v1/responses/{id}": {"GET": self.retrieve, "DELETE": self.delete},
            "/v1/responses/{id}/input_items": {"GET": self.input_items},
        }

    # -- POST /v1/responses ---------------------------------------------------------------------
    async def create(self, request: Request, handle_chat: ChatHandler) -> Response | StreamResponse:
        try:
            if request.error is not None:
                raise request.error
            req = parse_request(request.body)
            history: list[Record] = []
            missing = None
            if req.previous_response_id:
                found = await chain(self.store, req.previous_response_id)
                history, missing = found.records, found.missing
            turn = Turn.start(req, history, self.clock.time())
            body = to_chat(req, history)
        except VllmSrError as exc:
            return error_response(exc)
        extra = {H_CHAIN_MISSING: missing} if missing else {}
        if missing:
            log.warning(
                "response %s continues %s, whose chain lost %s: sent without the turns before it",
                turn.response_id,
                req.previous_response_id,
                missing,
            )
        inner = Request(
            "POST",
            "/v1/chat/completions",
            "",
            request.headers,
            json.dumps(body, ensure_ascii=False).encode(),
            conn=request.conn,
            peer=request.peer,
            version=request.version,
        )
        rewrite = StreamTranslator(turn) if req.stream else None
        if rewrite is not None:
            rewrite.headers.update(extra)
        answer = await handle_chat(inner, rewrite)
        if isinstance(answer, StreamResponse):  # streamed through the rewrite
            if rewrite is not None and rewrite.completed is not None:
                await self._keep(turn, rewrite.completed)
            return answer
        answer.headers.update(extra)
        return await self._translate(turn, answer)

    async def _translate(self, turn: Turn, answer: Response) -> Response:
        """A whole answer of the chat path (the backend's JSON, a cached answer, a
        fast_response; as SSE when streaming was asked) as the Responses API's."""
        if answer.status >= 400:
            return answer  # an error, as upstream passes it through
        is_sse = answer.content_type.startswith(CONTENT_TYPE)
        doc: JsonObject = {}
        try:
            if is_sse:
                sse = answer.body
            else:
                parsed = json_object(json.loads(answer.body))
                if parsed is None or not isinstance(parsed.get("choices"), list):
                    return answer  # not a chat completion: as it is
                doc = parsed
                sse = replay_sse(doc)
        except ValueError:
            return answer
        if turn.request.stream:
            events, completed = translate_whole(turn, sse)
            if completed is not None:
                await self._keep(turn, completed)
            return Response(events, answer.status, CONTENT_TYPE, answer.headers)
        response = translate_whole(turn, sse)[1] if is_sse else from_chat(turn, doc)
        assert response is not None  # a translation's end always completes it
        if not await self._keep(turn, response):
            response["store"] = False
        body = json.dumps(response, ensure_ascii=False).encode()
        return Response(body, answer.status, headers=answer.headers)

    async def _keep(self, turn: Turn, response: JsonObject) -> bool:
        """Store the response unless ``store: false``; a store that fails is logged and the
        answer still goes out (as upstream), saying ``store: false`` where it can."""
        if not turn.request.store:
            return True
        try:
            await self.store.put(turn.record(response))
        except VllmSrError as exc:
            self.store_failures += 1
            log.warning("response %s not stored: %s", turn.response_id, exc.message)
            return False
        self.stored += 1
        return True

    # -- GET / DELETE /v1/responses/{id} ----------------------------------------------------------
    async def _record(self, request: Request) -> Record:
        rid = response_id_of(request.path)
        record = await self.store.get(rid)
        if record is None:
            raise ResponseNotFound(
                f"response {rid!r} not found (never stored, stored with store: false, "
                "deleted, or expired)",
                response_id=rid,
            )
        return record

    async def retrieve(self, request: Request) -> Response:
        try:
            record = await self._record(request)
        except VllmSrError as exc:
            return error_response(exc)
        doc = {k: v for k, v in record.items() if k != "input"}
        return Response(json.dumps(doc, ensure_ascii=False).encode())

    async def delete(self, request: Request) -> Response:
        rid = response_id_of(request.path)
        try:
            if not await self.store.delete(rid):
                raise ResponseNotFound(f"response {rid!r} not found", response_id=rid)
        except VllmSrError as exc:
            return error_response(exc)
        doc = {"id": rid, "object": "response.deleted", "deleted": True}
        return Response(json.dumps(doc).encode())

    async def input_items(self, request: Request) -> Response:
        try:
            record = await self._record(request)
        except VllmSrError as exc:
            return error_response(exc)
        items: list[JsonObject] = []
        if record.get("instructions"):
            part = {"type": "input_text", "text": record["instructions"]}
            items.append(
                {
                    "id": new_id("item_"),
                    "type": "message",
                    "role": "system",
                    "content": [part],
                    "status": "completed",
                }
            )
        stored = record.get("input")
        if isinstance(stored, list):
            items += [i for raw in stored if (i := json_object(raw)) is not None]
        doc = {
            "object": "list",
            "data": items,
            "first_id": items[0].get("id", "") if items else "",
            "last_id": items[-1].get("id", "") if items else "",
            "has_more": False,
        }
        return Response(json.dumps(doc, ensure_ascii=False).encode())
