"""Router mode's Prometheus families, built at scrape time from the router's counters (the
request path only increments a Counter): decisions by decision and model, matched signals,
routing fallbacks by reason, unknown signals by family and reason, backend fallbacks by model
and reason, selector fallbacks by method, decision and reason, Router Learning's actions by
decision, method and action, each backend's requests, errors and health, the response cache's
hits, misses, writes, errors, entries and bytes, router_replay's records written and lost by
store, shadow_dispatch's copies by outcome, and the Responses API's responses stored and not
stored (its store failed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vllm_sr.router.chat import ChatRouter

if TYPE_CHECKING:
    from vllm_sr.router.responses.api import ResponsesAPI

BACKEND_STATES = ("unknown", "healthy", "unhealthy")


class RouterCollector(Collector):
    """``current`` returns the live generation's ChatRouter (None in Engine mode);
    ``responses`` the Responses API (None while ``global.services.response_api`` is off)."""

    def __init__(
        self,
        current: Callable[[], ChatRouter | None],
        responses: Callable[[], ResponsesAPI | None] = lambda: None,
    ) -> None:
        self.current = current
        self.responses = responses

    def collect(self) -> Iterator[Metric]:
        chat = self.current()
        if chat is None:
            return
        stats = chat.stats
        yield _counter(
            "vllm_sr_router_decisions",
            "Routed chat requests by decision and model ((default): no decision matched)",
            ["decision", "model"],
            {(d, m): n for (d, m), n in stats.decisions.items()},
        )
        yield _counter(
            "vllm_sr_router_signal_matches",
            "Routed chat requests on which a signal matched",
            ["signal"],
            {(k,): n for k, n in stats.signals.items()},
        )
        yield _counter(
            "vllm_sr_router_fallbacks",
            "Routed chat requests sent to the default model because routing could not decide",
            ["reason"],
            {(k,): n for k, n in stats.fallbacks.items()},
        )
        yield _counter(
            "vllm_sr_router_unknown_signals",
            "Signals that could not be evaluated on a routed chat (they matched no rule), by "
            "family and reason (overloaded, unavailable, timeout, failed)",
            ["family", "reason"],
            {(f, r): n for (f, r), n in stats.unknown.items()},
        )
        yield _counter(
            "vllm_sr_router_direct",
            "Chat requests that named a model (no routing)",
            ["model"],
            {(k,): n for k, n in stats.direct.items()},
        )
        yield _counter(
            "vllm_sr_router_backend_fallbacks",
            "Routed chats whose model failed before the first byte and went to the next model",
            ["model", "reason"],
            {(m, r): n for (m, r), n in stats.backend_fallbacks.items()},
        )
        selector_fallbacks: dict[tuple[str, ...], int] = {}
        for router in chat.recipes.values():
            for key, n in router.selection.fallbacks.items():
                selector_fallbacks[key] = selector_fallbacks.get(key, 0) + n
        yield _counter(
            "vllm_sr_router_selector_fallbacks",
            "Routed chats whose decision's selector failed and that went to its first modelRef "
            "(upstream's llm_model_selection_fallback_total), by method, decision and reason",
            ["method", "decision", "reason"],
            selector_fallbacks,
        )
        yield _counter(
            "vllm_sr_router_looper_runs",
            "Looper decisions run by vllm-sr, by algorithm and outcome (ok, error)",
            ["algorithm", "outcome"],
            {(a, o): n for (a, o), n in stats.looper_runs.items()},
        )
        yield _counter(
            "vllm_sr_router_looper_calls",
            "Loopers' internal chat calls, by algorithm and the model that answered",
            ["algorithm", "model"],
            {(a, m): n for (a, m), n in stats.looper_calls.items()},
        )
        yield _counter(
            "vllm_sr_router_looper_iterations",
            "Loopers' iterations (answers received), by algorithm",
            ["algorithm"],
            {(a,): n for a, n in stats.looper_iterations.items()},
        )
        yield _counter(
            "vllm_sr_router_learning_actions",
            "Router Learning's actions on routed chats, by decision, method (adaptation, "
            "protection) and action (hold_current, allow_switch, propose_switch, ...)",
            ["decision", "method", "action"],
            {(d, m, a): n for (d, m, a), n in chat.learning.state.actions.items()},
        )
        yield _counter(
            "vllm_sr_router_learning_store_errors",
            "Router Learning's redis state store failures (the router's own copy was used)",
            [],
            {(): chat.learning.state.store_errors},
        )
        yield from backend_families(chat)
        yield from cache_families(chat)
        yield from replay_families(chat)
        yield _counter(
            "vllm_sr_router_shadow_copies",
            "shadow_dispatch copies by decision, secondary model and outcome (ok, failed, "
            "timeout, too_large, dropped: the decision's queue was full, sampled_out, cancelled)",
            ["decision", "model", "outcome"],
            {(d, m, o): n for (d, m, o), n in chat.shadow.outcomes.items()},
        )
        yield from responses_families(self.responses())


def _counter(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, n in sorted(values.items()):
        family.add_metric(list(key), n)
    return family


def backend_families(chat: ChatRouter) -> Iterator[Metric]:
    labels = ["model", "url"]
    requests = CounterMetricFamily(
        "vllm_sr_backend_requests", "Chat requests proxied to a backend", labels=labels
    )
    errors = CounterMetricFamily(
        "vllm_sr_backend_errors", "Proxied chat requests that failed", labels=labels
    )
    state = GaugeMetricFamily(
        "vllm_sr_backend_state", "1 for the backend's health state", labels=[*labels, "state"]
    )
    for b in chat.backends.all():
        key = [b.model, b.api_base]
        requests.add_metric(key, b.requests)
        errors.add_metric(key, b.errors)
        for s in BACKEND_STATES:
            state.add_metric([*key, s], 1.0 if b.health.state == s else 0.0)
    yield from (requests, errors, state)


def cache_families(chat: ChatRouter) -> Iterator[Metric]:
    """The response cache: hits by decision and tier, misses by decision and mode, writes,
    store errors, and (memory store) entries and bytes."""
    if chat.cache is None:
        return
    stats = chat.cache.stats
    yield _counter(
        "vllm_sr_router_cache_hits",
        "Chats answered from the response cache, by decision and tier (exact, semantic)",
        ["decision", "tier"],
        {(d, t): n for (d, t), n in stats.hits.items()},
    )
    yield _counter(
        "vllm_sr_router_cache_misses",
        "Response-cache lookups that found nothing, by decision and mode",
        ["decision", "mode"],
        {(d, m): n for (d, m), n in stats.misses.items()},
    )
    yield _counter(
        "vllm_sr_router_cache_writes",
        "Answers written to the response cache, by decision",
        ["decision"],
        {(k,): n for k, n in stats.writes.items()},
    )
    yield _counter(
        "vllm_sr_router_cache_errors",
        "Response-cache store failures (the chat was served uncached), by store",
        ["store"],
        {(k,): n for k, n in stats.errors.items()},
    )
    usage = chat.cache.store.usage()
    if usage is not None:
        entries = GaugeMetricFamily(
            "vllm_sr_router_cache_entries", "Entries in the memory response cache"
        )
        entries.add_metric([], usage[0])
        size = GaugeMetricFamily(
            "vllm_sr_router_cache_bytes", "Bytes held by the memory response cache"
        )
        size.add_metric([], usage[1])
        yield from (entries, size)


def replay_families(chat: ChatRouter) -> Iterator[Metric]:
    """router_replay: records written and lost (by reason: store_down, store_error,
    queue_full), and whether the store is up."""
    writer = chat.replay.writer
    kind = writer.store.kind
    yield _counter(
        "vllm_sr_router_replay_records",
        "router_replay records written to their store",
        ["store"],
        {(kind,): writer.written},
    )
    yield _counter(
        "vllm_sr_router_replay_lost",
        "router_replay records lost (the chat was served), by store and reason",
        ["store", "reason"],
        {(kind, r): n for r, n in writer.lost.items()},
    )
    up = GaugeMetricFamily(
        "vllm_sr_router_replay_store_up",
        "1 while the router_replay store is usable",
        labels=["store"],
    )
    up.add_metric([kind], 1.0 if writer.state == "up" else 0.0)
    yield up


def responses_families(api: ResponsesAPI | None) -> Iterator[Metric]:
    """The Responses API: responses stored, and those its store failed to keep (answered all
    the same, ``store: false``), by store."""
    if api is None:
        return
    kind = api.store.kind
    yield _counter(
        "vllm_sr_router_responses_stored",
        "Responses API responses written to their store",
        ["store"],
        {(kind,): api.stored},
    )
    yield _counter(
        "vllm_sr_router_responses_store_failures",
        "Responses API responses answered but not stored: the store failed, by store",
        ["store"],
        {(kind,): api.store_failures},
    )
