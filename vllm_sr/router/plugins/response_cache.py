"""The ``response_cache`` plugin on a routed chat: the lookup before the backend is asked, the
write once the backend's answer is whole (vllm_sr/router/cache/* own the keys, the answer's
form and the stores).

Active for a chat when the store is on, the matched decision's plugin has ``enabled: true``
and the scope's identity is present (upstream's rule). Lookup: ``exact`` mode asks the exact
key, ``semantic`` the nearest entry of the semantic group at or above the threshold,
``exact_then_semantic`` both in that order. Write: only a 200, complete answer (see
cache/answer.py); never when the request said ``no-store``/``bypass`` or the decision's
retention directive says ``drop`` (vllm_sr/router/retention.py, which also makes ``ttl_turns``
the entry's lifetime); never an answer from a fallback model (the entry would be filed under a
model that did not write it). A store that
fails (Redis down) is counted in ``errors`` and logged; the chat goes on uncached."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.config.plugin_cache import ResponseCachePlugin
from vllm_sr.errors import VllmSrError
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router import retention as retention_rules
from vllm_sr.router.cache import keys
from vllm_sr.router.cache.answer import as_hit
from vllm_sr.router.cache.embedding import QueryEmbedding
from vllm_sr.router.cache.store import DEFAULT_TTL_S, CacheStore, Entry, normalise

if TYPE_CHECKING:
    from vllm_sr.config.routing import Decision, Retention
    from vllm_sr.config.schema import GlobalSection
    from vllm_sr.router.route import Exchange

log = logging.getLogger("vllm_sr.router.cache")


@dataclass
class CacheStats:
    """Counters for /metrics and vllm-sr-top."""

    hits: Counter[tuple[str, str]] = field(default_factory=Counter)  # (decision, tier)
    misses: Counter[tuple[str, str]] = field(default_factory=Counter)  # (decision, mode)
    writes: Counter[str] = field(default_factory=Counter)  # decision
    errors: Counter[str] = field(default_factory=Counter)  # store kind
    skipped: Counter[str] = field(default_factory=Counter)  # why a chat was not cached

    def to_json(self) -> JsonObject:
        return {
            "hits": [
                {"decision": d, "tier": t, "count": n} for (d, t), n in sorted(self.hits.items())
            ],
            "misses": [
                {"decision": d, "mode": m, "count": n} for (d, m), n in sorted(self.misses.items())
            ],
            "writes": dict(sorted(self.writes.items())),
            "errors": dict(sorted(self.errors.items())),
            "skipped": dict(sorted(self.skipped.items())),
        }


@dataclass
class CachePlan:
    """One chat's cache work: its keys, what the request allows, its TTL, whether the
    decision's retention directive forbids the write (``drop``)."""

    plugin: ResponseCachePlugin
    decision: str
    key: str
    group: str | None
    controls: keys.Controls
    ttl_s: int
    embedding: QueryEmbedding
    drop: bool = False

    @property
    def mode(self) -> str:
        return self.plugin.effective_mode

    @property
    def semantic(self) -> bool:
        return self.mode != "exact" and self.group is not None


@dataclass(frozen=True)
class Hit:
    doc: JsonObject
    tier: str  # exact or semantic
    similarity: float


class ResponseCache:
    """The cache of one service: one store, shared by every decision and recipe."""

    def __init__(
        self,
        store: CacheStore,
        *,
        exchange: Exchange,
        default_ttl_s: int = DEFAULT_TTL_S,
        signal_timeout_ms: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
        stats: CacheStats | None = None,
    ) -> None:
        self.store = store
        self.exchange = exchange
        self.default_ttl_s = default_ttl_s
        self.signal_timeout_ms = signal_timeout_ms
        self.clock = clock
        self.stats = stats if stats is not None else CacheStats()

    def plan(
        self,
        plugin: ResponseCachePlugin,
        *,
        body: Mapping[str, object],
        headers: Mapping[str, str],
        recipe: str,
        decision: Decision,
        selected_model: str,
        user_id_header: str,
        user_groups_header: str,
        embedding: QueryEmbedding,
        retention: Retention | None = None,
    ) -> CachePlan | None:
        """The chat's plan, or None when it is not cached (no identity for the scope). The
        TTL: the plugin's (else the store's), bounded by the request's ``ttl=``; a
        ``retention`` directive's ``ttl_turns`` replaces it (upstream applies it last)."""
        scope = plugin.effective_scope
        identity = keys.scope_identity(scope, headers, user_id_header, user_groups_header)
        if identity is None:
            self.stats.skipped["no_identity"] += 1
            return None
        part = keys.partition(
            recipe=recipe,
            decision=decision.name,
            request_model=str(body.get("model")),
            selected_model=selected_model,
            scope=scope,
            identity=identity,
            plugin=plugin,
            policy=keys.policy_fingerprint(decision),
        )
        controls = keys.parse_controls(plugin.controls(), headers)
        configured = plugin.ttl_seconds if plugin.ttl_seconds is not None else self.default_ttl_s
        ttl = retention_rules.ttl_override_s(retention)
        return CachePlan(
            plugin,
            decision.name,
            keys.exact_key(part, body),
            keys.semantic_group(part, body),
            controls,
            ttl if ttl is not None else keys.effective_ttl(configured, controls.ttl_s),
            embedding,
            drop=retention_rules.drops(retention),
        )

    async def lookup(self, plan: CachePlan) -> Hit | None:
        if not plan.controls.read:
            self.stats.skipped["no-cache"] += 1
            return None
        try:
            hit = await self._lookup(plan)
        except VllmSrError as exc:
            self.stats.errors[self.store.kind] += 1
            log.warning("response cache lookup failed; serving uncached: %s", exc.message)
            return None
        if hit is None:
            self.stats.misses[(plan.decision, plan.mode)] += 1
        else:
            self.stats.hits[(plan.decision, hit.tier)] += 1
        return hit

    async def _lookup(self, plan: CachePlan) -> Hit | None:
        now = self.clock.time()
        if plan.mode in ("exact", "exact_then_semantic"):
            entry = await self.store.get(plan.key)
            if entry is not None and self._fresh(entry, plan, now):
                return Hit(as_hit(json.loads(entry.answer)), "exact", 1.0)
        if plan.semantic and plan.group is not None:
            vector = await plan.embedding.vector(self.exchange, self.signal_timeout_ms)
            if vector is None:
                return None
            found = await self.store.nearest(plan.group, vector, plan.plugin.threshold)
            if found is not None and self._fresh(found[0], plan, now):
                return Hit(as_hit(json.loads(found[0].answer)), "semantic", found[1])
        return None

    @staticmethod
    def _fresh(entry: Entry, plan: CachePlan, now: float) -> bool:
        if entry.expires <= now:
            return False
        max_age = plan.controls.max_age_s
        return max_age is None or now - entry.created <= max_age

    async def write(self, plan: CachePlan, doc: JsonObject | None) -> None:
        """Store the answer (``doc``: the recorder's document, None when not cacheable)."""
        if doc is None:
            self.stats.skipped["not_cacheable"] += 1
            return
        if not plan.controls.write:
            self.stats.skipped["no-store"] += 1
            return
        if plan.drop:
            self.stats.skipped[retention_rules.DROP_REASON] += 1
            return
        if plan.ttl_s <= 0:
            return
        vector = None
        if plan.semantic:
            vector = await plan.embedding.vector(self.exchange, self.signal_timeout_ms)
        now = self.clock.time()
        entry = Entry(
            key=plan.key,
            answer=json.dumps(doc, ensure_ascii=False).encode(),
            created=now,
            expires=now + plan.ttl_s,
            group=plan.group if vector is not None else None,
            vector=normalise(vector) if vector is not None else None,
        )
        try:
            await self.store.put(entry)
        except VllmSrError as exc:
            self.stats.errors[self.store.kind] += 1
            log.warning("response cache write failed; answer not cached: %s", exc.message)
            return
        self.stats.writes[plan.decision] += 1


def build_store(
    global_: GlobalSection | None, *, clock: Clock = SYSTEM_CLOCK
) -> tuple[CacheStore | None, int]:
    """``global.stores.response_cache`` -> (the store, or None when the cache is off; the
    default TTL). ``enabled`` unset means on (upstream's default); ``backend_type`` memory (the
    default) or redis (the others are refused at load); ``max_entries`` (default 1000) and
    vllm-sr's ``max_bytes`` (default 256 MiB) bound the memory store."""
    from vllm_sr.router.cache.redis_store import RedisStore, redis_client
    from vllm_sr.router.cache.store import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, MemoryStore

    if global_ is None:
        return MemoryStore(clock=clock), DEFAULT_TTL_S
    conf = global_.stores.response_cache
    enabled = conf.enabled if "enabled" in conf.model_fields_set else True
    ttl = conf.ttl_seconds if conf.ttl_seconds is not None else DEFAULT_TTL_S
    if not enabled:
        return None, ttl
    if (conf.backend_type or "memory") == "redis":
        client, prefix = redis_client(conf.redis)
        return RedisStore(client, prefix), ttl
    max_entries = conf.max_entries if conf.max_entries is not None else DEFAULT_MAX_ENTRIES
    max_bytes = conf.max_bytes or DEFAULT_MAX_BYTES
    return MemoryStore(max_bytes=max_bytes, max_entries=max_entries, clock=clock), ttl
