"""Backend health on a fake clock, and the router's counters in Prometheus form."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from vllm_sr.clock import FakeClock
from vllm_sr.config.routing import Providers, Routing
from vllm_sr.router.backends import BackendHealth, BackendSet
from vllm_sr.router.chat import build_chat_router
from vllm_sr.router.metrics import RouterCollector
from vllm_sr.router.route import RouteResult


def test_health_starts_unknown_and_usable_then_checks_on_schedule() -> None:
    clock = FakeClock()
    h = BackendHealth(clock, every_s=5.0)
    assert h.state == "unknown" and h.usable and h.due()
    h.record_success()
    assert h.state == "healthy" and not h.due()
    clock.advance(4.9)
    assert not h.due()
    clock.advance(0.1)
    assert h.due()


def test_failures_back_off_doubling_and_a_success_resets() -> None:
    clock = FakeClock()
    h = BackendHealth(clock)
    delays = []
    for _ in range(8):
        start = clock.monotonic()
        h.record_failure("refused")
        delays.append(round(h.next_check_at - start, 3))
        clock.advance(h.next_check_at - start)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert not h.usable and h.failures == 8 and h.last_error == "refused"
    h.record_success()
    h.record_failure("again")
    assert h.next_check_at - clock.monotonic() == 0.5


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
