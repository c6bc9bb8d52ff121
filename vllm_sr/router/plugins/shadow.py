"""The ``shadow_dispatch`` plugin: after the primary dispatch, a sampled copy of the chat goes
to a secondary model in the background. The caller's answer never waits for it and never
changes because of it: :meth:`ShadowDispatcher.submit` only enqueues, and a copy's outcome
touches nothing but its own counters (not the secondary's health, statistics or outlier
state, which steer the chats that callers see).

- Bounds, per decision: ``max_concurrency`` copies in flight, ``max_queue_depth`` waiting; a
  copy beyond both is dropped (counted ``dropped``). ``sample_rate`` picks the chats copied
  (the rest are counted ``sampled_out``).
- The copy: the request as the primary got it after the decision's tools, tool_selection and
  masking (masked PII never reaches the secondary), with the decision's system_prompt and
  request_params; ``model`` becomes the secondary backend's name for it, and it is sent
  with ``stream: false``. Headers: the secondary backend's own configured credential and
  ``Content-Type``, plus the decision's header_mutation values named in
  ``forward_headers``; never the caller's headers.
- ``max_retries`` further tries (on the model's backends in turn) after a connection failure
  or a 5xx; ``timeout_seconds`` bounds the whole copy; the answer is read up to
  ``max_response_bytes``.
- Outcomes counted by (decision, model, outcome): ``ok``, ``failed`` (an answer >= 400 or no
  connection, after the retries), ``timeout``, ``too_large``, ``dropped``, ``sampled_out``,
  ``cancelled`` (the config generation was retired with the copy in flight)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from vllm_sr.config.plugin_shadow import ShadowDispatchPlugin
from vllm_sr.config.routing_plugins import DecisionPlugins
from vllm_sr.jsontypes import JsonObject
from vllm_sr.pool.client import Broken
from vllm_sr.router.backend import Backend
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.plugins import shapers

DEFAULT_CONCURRENCY = 2
DEFAULT_QUEUE = 8
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_BYTES = 1 << 20


@dataclass
class Copy:
    decision: str
    conf: ShadowDispatchPlugin
    body: bytes
    headers: dict[str, str]

    @property
    def model(self) -> str:
        return self.conf.model or ""


@dataclass
class Lane:
    """One decision's copies: those in flight and those waiting for a slot."""

    inflight: int = 0
    waiting: deque[Copy] = field(default_factory=deque)


class ShadowDispatcher:
    """One config generation's shadow copies (their tasks, bounds and counters)."""

    def __init__(
        self,
        backends: BackendSet,
        outcomes: Counter[tuple[str, str, str]] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.backends = backends
        self.rand = rand
        # (decision, model, outcome); the router's stats keep it across config reloads
        self.outcomes: Counter[tuple[str, str, str]] = Counter() if outcomes is None else outcomes
        self.lanes: dict[tuple[str, str], Lane] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def submit(
        self,
        recipe: str,
        decision: str | None,
        plugins: DecisionPlugins,
        body: Mapping[str, object],
    ) -> None:
        """Queue a copy of ``body`` (the chat after the decision's request plugins) when the
        decision's shadow_dispatch is on and samples it; never waits."""
        conf = plugins.shadow_dispatch
        if decision is None or conf is None or not conf.enabled or not conf.model:
            return
        rate = 1.0 if conf.sample_rate is None else conf.sample_rate
        if rate < 1.0 and self.rand() >= rate:
            self.outcomes[(decision, conf.model, "sampled_out")] += 1
            return
        set_headers = (
            shapers.header_changes(plugins.header_mutation)[0]
            if plugins.header_mutation is not None
            else {}
        )
        copy = Copy(decision, conf, self._payload(body, plugins), self._headers(conf, set_headers))
        lane = self.lanes.setdefault((recipe, decision), Lane())
        if lane.inflight < (conf.max_concurrency or DEFAULT_CONCURRENCY):
            self._start(lane, copy)
        elif len(lane.waiting) < (conf.max_queue_depth or DEFAULT_QUEUE):
            lane.waiting.append(copy)
        else:
            self.outcomes[(decision, conf.model, "dropped")] += 1

    @staticmethod
    def _payload(body: Mapping[str, object], plugins: DecisionPlugins) -> bytes:
        out: JsonObject = dict(body)
        if plugins.system_prompt is not None:
            out = shapers.apply_system_prompt(out, plugins.system_prompt)
        if plugins.request_params is not None:
            out = shapers.apply_request_params(out, plugins.request_params)
        out["stream"] = False
        out.pop("stream_options", None)
        return json.dumps(out, ensure_ascii=False).encode()

    @staticmethod
    def _headers(conf: ShadowDispatchPlugin, set_headers: Mapping[str, str]) -> dict[str, str]:
        wanted = {n.strip().lower() for n in conf.forward_headers}
        return {k: v for k, v in set_headers.items() if k.lower() in wanted}

    def _start(self, lane: Lane, copy: Copy) -> None:
        lane.inflight += 1
        task = asyncio.ensure_future(self._run(copy))
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, lane))

    def _done(self, task: asyncio.Task[None], lane: Lane) -> None:
        self.tasks.discard(task)
        lane.inflight -= 1
        if lane.waiting and not task.cancelled():
            self._start(lane, lane.waiting.popleft())

    async def _run(self, copy: Copy) -> None:
        outcome = "failed"
        try:
            async with asyncio.timeout(copy.conf.timeout_seconds or DEFAULT_TIMEOUT_S):
                outcome = await self._send(copy)
        except TimeoutError:
            outcome = "timeout"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.outcomes[(copy.decision, copy.model, outcome)] += 1

    async def _send(self, copy: Copy) -> str:
        if not self.backends.models.get(copy.model):
            return "failed"
        tried: list[Backend] = []
        outcome = "failed"
        for _ in range(copy.conf.max_retries + 1):
            backend = (
                self.backends.pick(copy.model)
                if not tried
                else self.backends.retry_pick(copy.model, tried) or tried[-1]
            )
            tried.append(backend)
            outcome = await self._once(backend, copy)
            if outcome != "retry":
                return outcome
        return "failed"

    async def _once(self, backend: Backend, copy: Copy) -> str:
        """One try -> ok, failed, too_large, or retry (no connection, or a 5xx)."""
        body = json.loads(copy.body)
        body["model"] = backend.model_id
        payload = json.dumps(body, ensure_ascii=False).encode()
        headers = {**backend.headers(), **copy.headers}
        limit = copy.conf.max_response_bytes or DEFAULT_MAX_BYTES
        try:
            client, prefix = self.backends.clients.for_url(backend.api_base)
            answer = await client.stream(
                "POST", f"{prefix}/chat/completions", payload, headers=headers
            )
        except (Broken, OSError):
            return "retry"
        size = 0
        try:
            async for data in answer:
                size += len(data)
                if size > limit:
                    return "too_large"
        except (Broken, OSError):
            return "retry"
        finally:
            await answer.aclose()
        if answer.status >= 500:
            return "retry"
        return "ok" if answer.status < 400 else "failed"

    async def close(self) -> None:
        """Cancel the copies in flight and drop those waiting (counted ``cancelled``)."""
        for (_, _), lane in self.lanes.items():
            for copy in lane.waiting:
                self.outcomes[(copy.decision, copy.model, "cancelled")] += 1
            lane.waiting.clear()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def idle(self) -> None:
        """Wait until no copy is in flight or waiting (tests, shutdown)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
