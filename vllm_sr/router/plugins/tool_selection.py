"""The ``tool_selection`` plugin in ``filter`` mode (upstream's
``X/req_tool_selection_filter_embed.go``): the request's own tools ranked by the cosine of
each tool's ``name description`` embedding to the query's, those at or above
``relevance_threshold`` (default 0.25) kept best first, topped up to ``preserve_count`` with
the next best. As upstream, it runs only when the request's ``tool_choice`` is ``"auto"`` and
after the ``tools`` policy (a ``none`` policy leaves nothing to select).

Embeddings are the decision deployment's: the query's is the one routing computed (or its one
exchange, vllm_sr/router/cache/embedding.py); the tool texts are embedded in one bundle per
chat for the texts not yet known, and kept (bounded) for the next chats. A failed exchange
leaves the tools as they are."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, TypeVar

import numpy
from numpy.typing import NDArray

from vllm_sr.config.plugin_request import ToolSelectionPlugin
from vllm_sr.errors import VllmSrError
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router import bundle
from vllm_sr.router.bundle import BUNDLE_PATH
from vllm_sr.router.cache.embedding import QueryEmbedding
from vllm_sr.router.cache.store import normalise

if TYPE_CHECKING:
    from vllm_sr.router.route import Exchange

log = logging.getLogger("vllm_sr.router.tools")

DEFAULT_RELEVANCE = 0.25
MAX_KNOWN = 4096  # tool texts whose embeddings are kept
TASK = "tools"
_T = TypeVar("_T")
Vector = NDArray[numpy.float32]


def tool_text(tool: object) -> str:
    """``name description`` (trimmed), as upstream embeds a tool."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict):
        return ""
    parts = [str(fn.get(k) or "").strip() for k in ("name", "description")]
    return " ".join(p for p in parts if p)


def select(tools: list[_T], scores: list[float], threshold: float, preserve: int) -> list[_T]:
    """Best first (ties in request order): those scoring ``threshold`` or more, then the next
    best (distinct names) up to ``preserve``."""
    order = sorted(range(len(tools)), key=lambda i: (-scores[i], i))
    kept = [i for i in order if scores[i] >= threshold]
    if preserve > len(kept):
        names = {_name(tools[i]) for i in kept}
        for i in order:
            if len(kept) >= preserve:
                break
            if i in kept or _name(tools[i]) in names:
                continue
            names.add(_name(tools[i]))
            kept.append(i)
    return [tools[i] for i in kept]


def _name(tool: object) -> str:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return str((fn or {}).get("name") or "").strip().lower()


class ToolEmbeddings:
    """Tool texts' embeddings on the decision deployment, kept across chats."""

    def __init__(self, deployment: str, exchange: Exchange, timeout_ms: float | None) -> None:
        self.deployment = deployment
        self.exchange = exchange
        self.timeout_ms = timeout_ms
        self.known: OrderedDict[str, Vector] = OrderedDict()
        self.exchanges = 0

    async def vectors(self, texts: list[str]) -> list[Vector] | None:
        missing = list(dict.fromkeys(t for t in texts if t not in self.known))
        if missing:
            body = bundle.request([bundle.embed_task(TASK, missing)])
            self.exchanges += 1
            try:
                status, answer = await self.exchange(
                    self.deployment, BUNDLE_PATH, body, self.timeout_ms
                )
            except VllmSrError as exc:
                log.info("tool_selection: embedding the tools failed: %s", exc.message)
                return None
            got = bundle.task_embeddings(answer, TASK) if status == 200 else None
            if got is None or len(got) != len(missing):
                return None
            for text, vec in zip(missing, got, strict=True):
                self.known[text] = normalise(vec)
                if len(self.known) > MAX_KNOWN:
                    self.known.popitem(last=False)
        try:
            return [self.known[t] for t in texts]
        except KeyError:
            return None  # evicted meanwhile by a chat with more tools than MAX_KNOWN


async def apply_tool_selection(
    body: JsonObject,
    plugin: ToolSelectionPlugin,
    query: QueryEmbedding,
    embeddings: ToolEmbeddings,
) -> JsonObject:
    tools = body.get("tools")
    if not plugin.enabled or plugin.mode != "filter" or body.get("tool_choice") != "auto":
        return body
    if not isinstance(tools, list) or not tools:
        return body
    qvec = await query.vector(embeddings.exchange, embeddings.timeout_ms)
    if qvec is None:
        return body
    texts = [tool_text(t) or _name(t) for t in tools]
    vecs = await embeddings.vectors(texts)
    if vecs is None:
        return body
    q = normalise(qvec)
    scores = [float(v @ q) if v.shape == q.shape else 0.0 for v in vecs]
    threshold = (
        plugin.relevance_threshold if plugin.relevance_threshold is not None else DEFAULT_RELEVANCE
    )
    kept = select(tools, scores, threshold, plugin.preserve_count)
    out = dict(body)
    if kept:
        out["tools"] = kept
    else:
        out.pop("tools", None)
        out.pop("tool_choice", None)
    return out
