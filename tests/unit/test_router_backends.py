"""Backends: health on a fake clock; the weighted spread, the credential, the model name and
the inventory as pure logic; then what real stand-in backends on real sockets receive; and the
router's counters in Prometheus form."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.backends import StandInBackend
from vllm_sr.clock import FakeClock
from vllm_sr.cluster.picking import weighted_pick
from vllm_sr.config.routing import ModelRef, Routing
from vllm_sr.config.routing_providers import Providers
from vllm_sr.httpserver import Request, Response
from vllm_sr.router.backend import health_probe
from vllm_sr.router.backend_proxy import Exchange
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.chat import build_chat_router
from vllm_sr.router.metrics import RouterCollector
from vllm_sr.router.reasoning import apply_reasoning
from vllm_sr.router.route import RouteResult


def test_health_starts_unknown_and_usable_then_checks_on_schedule() -> None:
    clock = FakeClock()
    h = health_probe(clock, every_s=5.0)
    assert h.state == "unknown" and h.usable and h.due()
    h.record_success()
    assert h.state == "healthy" and not h.due()
    clock.advance(4.9)
    assert not h.due()
    clock.advance(0.1)
    assert h.due()


def test_failures_back_off_doubling_and_a_success_resets() -> None:
    clock = FakeClock()
    h = health_probe(clock)
    delays = []
    for _ in range(8):
        start = clock.monotonic()
        h.record_failure("refused")
        assert h.next_check_at is not None
        delays.append(round(h.next_check_at - start, 3))
        clock.advance(h.next_check_at - start)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert not h.usable and h.failures == 8 and h.last_error == "refused"
    h.record_success()
    h.record_failure("again")
    assert h.next_check_at is not None and h.next_check_at - clock.monotonic() == 0.5


PROVIDERS = Providers.model_validate(
    {
        "defaults": {"default_model": "a"},
        "models": [
            {
                "name": "a",
                "backend_refs": [{"endpoint": "127.0.0.1:1"}, {"endpoint": "127.0.0.1:2"}],
            },
            {"name": "b", "backend_refs": [{"endpoint": "127.0.0.1:3"}]},
        ],
    }
)


def test_pick_prefers_usable_backends_with_fewest_in_flight() -> None:
    s = BackendSet(PROVIDERS, clock=FakeClock())
    one, two = s.models["a"]
    one.inflight = 3
    assert s.pick("a") is two
    two.health.record_failure("down")
    assert s.pick("a") is one
    one.health.record_failure("down")
    assert not s.healthy("a") and s.healthy("b")
    assert s.pick("a") is one  # none usable: the first, and the request reports the error


async def _never(*args: object) -> tuple[int, bytes]:
    raise AssertionError("no exchange expected")


def test_metrics_families_carry_decisions_signals_fallbacks_and_backends() -> None:
    chat = build_chat_router(
        PROVIDERS,
        Routing(),
        exchange=_never,
        decision_deployment="primary",
        auto_model_names=["auto"],
        backends=BackendSet(PROVIDERS, clock=FakeClock()),
    )
    chat.stats.record(RouteResult("b", "coding", 1.0, ("keyword:code",)))
    chat.stats.record(RouteResult("a", fallback="signals:overloaded"))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RouterCollector(lambda: chat))
    text = generate_latest(registry).decode()
    assert 'vllm_sr_router_decisions_total{decision="coding",model="b"} 1.0' in text
    assert 'vllm_sr_router_decisions_total{decision="(default)",model="a"} 1.0' in text
    assert 'vllm_sr_router_signal_matches_total{signal="keyword:code"} 1.0' in text
    assert 'vllm_sr_router_fallbacks_total{reason="signals:overloaded"} 1.0' in text
    assert (
        'vllm_sr_backend_state{model="b",state="unknown",url="http://127.0.0.1:3/v1"} 1.0' in text
    )
    empty = CollectorRegistry(auto_describe=False)
    empty.register(RouterCollector(lambda: None))
    assert "vllm_sr_router" not in generate_latest(empty).decode()


# -- the weighted spread ------------------------------------------------------------------------


def providers(*models: dict[str, Any]) -> Providers:
    return Providers.model_validate({"defaults": {"default_model": "m"}, "models": list(models)})


def weighted(*weights: int, **model: Any) -> BackendSet:
    refs = [{"endpoint": f"127.0.0.1:{i + 1}", "weight": w} for i, w in enumerate(weights)]
    return BackendSet(providers({"name": "m", "backend_refs": refs, **model}), clock=FakeClock())


def picks(s: BackendSet, n: int) -> list[str]:
    return [s.pick("m").api_base.split(":")[2].split("/")[0] for _ in range(n)]


def test_weights_spread_chats_smoothly_and_exactly_with_zero_as_one() -> None:
    s = weighted(3, 1, 0)
    seq = picks(s, 25)
    assert Counter(seq) == {"1": 15, "2": 5, "3": 5}
    assert seq[:5] == ["1", "2", "1", "3", "1"]  # interleaved, not 1,1,1,2,3
    assert seq[5:10] == seq[:5]  # the same cycle of sum-of-weights picks, deterministic


def test_an_unusable_backend_gets_no_share_until_it_is_healthy_again() -> None:
    s = weighted(1, 1, 2)
    s.models["m"][2].health.record_failure("down")
    assert Counter(picks(s, 10)) == {"1": 5, "2": 5}
    s.models["m"][2].health.record_success()
    assert Counter(picks(s, 40)) == {"1": 10, "2": 10, "3": 20}


def test_in_flight_per_weight_goes_first_and_round_robin_ignores_it() -> None:
    s = weighted(3, 1)
    heavy, light = s.models["m"]
    heavy.inflight = 4  # 4/3 in flight per unit of weight against 0/1
    assert s.pick("m") is light
    light.inflight = 2  # 4/3 < 2/1
    assert s.pick("m") is heavy
    rr = weighted(3, 1, reliability={"lb_policy": "round_robin"})
    for b in rr.models["m"]:
        b.inflight = 0 if b is rr.models["m"][1] else 9
    assert Counter(picks(rr, 8)) == {"1": 6, "2": 2}


def test_weighted_pick_alone_follows_the_weights() -> None:
    s = weighted(2, 5)
    group = s.models["m"]
    assert Counter(weighted_pick(group).weight for _ in range(70)) == {2: 20, 5: 50}


# -- the credential, the model name, the inventory ----------------------------------------------


def backend_of(ref: dict[str, Any], **model: Any) -> Any:
    s = BackendSet(
        providers({"name": "m", "backend_refs": [ref], **model}),
        clock=FakeClock(),
    )
    return s.models["m"][0]


def test_the_credential_follows_upstreams_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN", "from-env")
    caller = {"authorization": "Bearer callers-own", "x-api-key": "callers-key"}
    base = {"endpoint": "127.0.0.1:1"}
    env = backend_of({**base, "api_key_env": "TOKEN"})
    assert env.headers(caller)["Authorization"] == "Bearer from-env"
    literal = backend_of({**base, "api_key_env": "TOKEN", "api_key": "literal"})
    assert literal.headers(caller)["Authorization"] == "Bearer literal"
    custom = backend_of({**base, "api_key": "k", "auth_header": "x-api-key", "auth_prefix": "Key"})
    assert custom.headers(caller) == {"Content-Type": "application/json", "x-api-key": "Key k"}
    # An empty prefix counts as unset (upstream's Go zero value): the provider's default.
    assert backend_of({**base, "api_key": "k", "auth_prefix": ""}).headers()["Authorization"] == (
        "Bearer k"
    )
    # No key: the caller's own header goes on; without one, nothing.
    assert backend_of(base).headers(caller)["Authorization"] == "Bearer callers-own"
    assert backend_of(base).headers() == {"Content-Type": "application/json"}
    monkeypatch.delenv("TOKEN")
    unset = backend_of({**base, "api_key_env": "TOKEN", "auth_header": "x-api-key"})
    assert unset.headers(caller) == {"Content-Type": "application/json", "x-api-key": "callers-key"}


def test_each_backend_gets_the_model_name_its_type_expects() -> None:
    refs = [
        {"endpoint": "127.0.0.1:1"},
        {"endpoint": "127.0.0.1:2", "type": "ollama"},
        {"base_url": "https://api.openai.com/v1", "provider": "openai", "name": "cloud"},
    ]
    ext = backend_set_models(refs, external_model_ids={"vllm": "Qwen/Qwen3-8B", "openai": "gpt"})
    assert [b.model_id for b in ext] == ["Qwen/Qwen3-8B", "m", "gpt"]
    pid = backend_set_models(refs, provider_model_id="qwen3-8b")
    assert [b.model_id for b in pid] == ["qwen3-8b"] * 3
    assert [b.id for b in pid] == ["m_primary", "m_backend-2", "m_cloud"]


def backend_set_models(refs: list[dict[str, Any]], **model: Any) -> list[Any]:
    s = BackendSet(providers({"name": "m", "backend_refs": refs, **model}), clock=FakeClock())
    return s.models["m"]


def test_the_inventory_reports_pricing_per_model_and_each_backends_place() -> None:
    s = BackendSet(
        providers(
            {
                "name": "m",
                "pricing": {"prompt_per_1m": 0.5, "completion_per_1m": 1.5},
                "backend_refs": [{"endpoint": "127.0.0.1:1", "weight": 4, "name": "gpu"}],
            },
            {"name": "free", "backend_refs": [{"endpoint": "127.0.0.1:2"}]},
        ),
        clock=FakeClock(),
    )
    priced, free = s.inventory()
    assert priced["pricing"] == {
        "currency": "USD",
        "prompt_per_1m": 0.5,
        "completion_per_1m": 1.5,
        "cached_input_per_1m": 0.0,
    }
    assert (priced["name"], priced["id"], priced["weight"], priced["type"]) == (
        "gpu",
        "m_gpu",
        4,
        "vllm",
    )
    assert free["pricing"] is None and free["weight"] == 1
    assert s.pricing == {"m": priced["pricing"], "free": None}


# -- real stand-in backends on real sockets -----------------------------------------------------


@pytest.fixture
async def standins() -> AsyncIterator[tuple[StandInBackend, StandInBackend]]:
    a = await StandInBackend("a").start()
    b = await StandInBackend("b").start()
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


def chat_request(headers: dict[str, str] | None = None) -> Request:
    return Request("POST", "/v1/chat/completions", "", headers or {}, b"")


async def test_real_backends_receive_chats_by_weight_with_their_credential_and_model_name(
    standins: tuple[StandInBackend, StandInBackend],
) -> None:
    a, b = standins
    s = BackendSet(
        providers(
            {
                "name": "m",
                "external_model_ids": {"vllm": "served-a", "remote": "served-b"},
                "backend_refs": [
                    {"endpoint": a.endpoint, "weight": 3, "api_key": "key-a"},
                    {
                        "base_url": f"http://{b.endpoint}/v1",
                        "type": "remote",
                        "auth_header": "x-api-key",
                        "auth_prefix": "Token",
                        "api_key": "key-b",
                    },
                ],
            }
        )
    )
    await s.start(health_checks=False)
    try:
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(8):
            backend = s.pick("m")
            out = await s.proxy(
                backend, Exchange(body, chat_request({"authorization": "Bearer c"}), {})
            )
            assert isinstance(out, Response) and out.status == 200
    finally:
        await s.close()
    assert (len(a.received), len(b.received)) == (6, 2)
    assert {r.body["model"] for r in a.received} == {"served-a"}
    assert {r.body["model"] for r in b.received} == {"served-b"}
    assert a.received[0].headers["Authorization"] == "Bearer key-a"
    assert b.received[0].headers["x-api-key"] == "Token key-b"
    assert "Authorization" not in b.received[0].headers  # the caller's is not passed on


async def test_a_real_backend_receives_the_reasoning_fields_and_the_loras_name(
    standins: tuple[StandInBackend, StandInBackend],
) -> None:
    a, _ = standins
    provs = Providers.model_validate(
        {
            "defaults": {
                "default_model": "m",
                "reasoning_families": {
                    "qwen3": {"type": "chat_template_kwargs", "parameter": "enable_thinking"}
                },
            },
            "models": [
                {
                    "name": "m",
                    "reasoning_family": "qwen3",
                    "provider_model_id": "Qwen/Qwen3-8B",
                    "backend_refs": [{"endpoint": a.endpoint}],
                }
            ],
        }
    )
    s = BackendSet(provs)
    await s.start(health_checks=False)
    body = {
        "model": "auto",
        "messages": [{"role": "user", "content": "prove it"}],
        "reasoning_effort": "high",
    }
    sent = json.dumps(body)
    thinking = ModelRef(model="m", use_reasoning=True)
    try:
        backend = s.pick("m")
        shaped = apply_reasoning(body, thinking, provs.models[0], provs.defaults, backend.ref)
        await s.proxy(backend, Exchange(shaped, chat_request(), {}))
        await s.proxy(backend, Exchange(shaped, chat_request(), {}, upstream_model="math-lora"))
    finally:
        await s.close()
    first, lora = a.received
    assert first.body == {
        "model": "Qwen/Qwen3-8B",
        "messages": body["messages"],
        "chat_template_kwargs": {"enable_thinking": True},
    }
    assert lora.body["model"] == "math-lora"
    assert json.dumps(body) == sent  # the caller's body is as it was
