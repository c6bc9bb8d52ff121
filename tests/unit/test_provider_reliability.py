"""``providers.models[].reliability`` (upstream's Envoy settings): every field accepted with
upstream's checks, the retry_on words vllm-sr cannot honour refused by name, Go durations; and
the logic that acts on them, on a fake clock: which failures are retried, ejection after
consecutive 5xx (time x times ejected, the percent cap), the order of attempts (retries on the
model's other backends first, then the next model), the health check's settings."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from vllm_sr.clock import FakeClock
from vllm_sr.config.problems import format_path
from vllm_sr.config.routing_base import NOT_SUPPORTED
from vllm_sr.config.routing_provider_rules import go_duration_s, providers_problems
from vllm_sr.config.routing_providers import Providers, seconds_or
from vllm_sr.router.backend_outlier import MAX_EJECTION_S, OutlierDetector
from vllm_sr.router.backend_proxy import AttemptFailed
from vllm_sr.router.backend_retry import RetryPolicy, covering_words
from vllm_sr.router.backends import BackendSet
from vllm_sr.router.fallback import Attempts

# upstream's balance recipe writes this block on each of its models
BALANCE = {
    "lb_policy": "least_request",
    "retry_count": 2,
    "retry_on": "connect-failure,refused-stream",
    "consecutive_5xx": 5,
    "base_ejection_time": "30s",
    "max_ejection_percent": 50,
    "health_check_path": "/health",
    "health_check_interval": "10s",
    "health_check_timeout": "2s",
}


def doc(n_backends: int = 2, **reliability: Any) -> dict[str, Any]:
    refs = [{"endpoint": f"127.0.0.1:{9000 + i}"} for i in range(n_backends)]
    return {
        "defaults": {"default_model": "m"},
        "models": [{"name": "m", "backend_refs": refs, "reliability": reliability}],
    }


def found(**reliability: Any) -> dict[str, str]:
    return {format_path(p.path): p.message for p in providers_problems(doc(**reliability))}


REL = "providers.models[0].reliability"


# -- config ------------------------------------------------------------------------------------


def test_every_upstream_field_is_accepted_and_read() -> None:
    assert found(**BALANCE) == {}
    rel = Providers.model_validate(doc(**BALANCE)).models[0].reliability
    assert rel is not None
    assert rel.retry_on_words == ["connect-failure", "refused-stream"]
    assert seconds_or(rel.base_ejection_time, 1.0) == 30.0
    assert seconds_or(rel.health_check_interval, 1.0) == 10.0
    assert seconds_or(rel.health_check_timeout, 1.0) == 2.0
    defaults = Providers.model_validate(doc()).models[0].reliability
    assert defaults is not None and defaults.max_ejection_percent == 50  # upstream's default
    assert defaults.consecutive_5xx == 0 and seconds_or(defaults.base_ejection_time, 7.0) == 7.0


@pytest.mark.parametrize(
    ("fields", "key", "words"),
    [
        ({"retry_count": 1}, "retry_on", ["retry_count 1 needs retry_on", "accepted: a comma"]),
        ({"retry_on": "5xx,bogus"}, "retry_on", ["unknown retry_on word 'bogus'", NOT_SUPPORTED]),
        (
            {"retry_on": "retriable-4xx"},
            "retry_on",
            ["retry_on condition 'retriable-4xx'", NOT_SUPPORTED, "supported: 5xx, gateway-error"],
        ),
        ({"base_ejection_time": "30x"}, "base_ejection_time", ["'30x' is not a duration"]),
        ({"health_check_interval": "10"}, "health_check_interval", ["'10' is not a duration"]),
        ({"health_check_timeout": "-1s"}, "health_check_timeout", ["e.g. 500ms, 30s, 1m30s"]),
        ({"health_check_interval": "0s"}, "health_check_interval", ["'0s' is no time", "above 0"]),
        ({"health_check_path": "health"}, "health_check_path", ["'health' does not start with /"]),
    ],
)
def test_each_bad_value_is_named_with_what_is_accepted(
    fields: dict[str, Any], key: str, words: list[str]
) -> None:
    problems = found(**fields)
    assert list(problems) == [f"{REL}.{key}"]
    for word in words:
        assert word in problems[f"{REL}.{key}"]
    with pytest.raises(ValidationError):
        Providers.model_validate(doc(**fields))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retry_count", 6),
        ("retry_count", -1),
        ("consecutive_5xx", -1),
        ("max_ejection_percent", 101),
        ("max_ejection_percent", -1),
        ("lb_policy", "random"),
    ],
)
def test_out_of_range_values_are_refused_at_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        Providers.model_validate(doc(**{field: value}))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("0", 0.0),
        ("2us", 2e-6),
        ("2\u00b5s", 2e-6),
        (".5s", 0.5),
        ("100ns", 1e-7),
        ("30", None),
        ("1x", None),
        ("-1s", None),
        ("s", None),
        ("", None),
        ("1 s", None),
    ],
)
def test_go_durations(text: str, seconds: float | None) -> None:
    assert go_duration_s(text) == (None if seconds is None else pytest.approx(seconds))


# -- which failures are retried ----------------------------------------------------------------


def test_retry_on_words_cover_the_failures_envoy_means() -> None:
    assert covering_words("connect") == {"connect-failure", "gateway-error", "5xx"}
    assert covering_words("reset") == {"reset", "gateway-error", "5xx"}
    assert covering_words("stream_first_chunk") == {"reset", "gateway-error", "5xx"}
    assert covering_words("http_503") == {"gateway-error", "5xx"}
    assert covering_words("http_500") == {"5xx"}
    assert covering_words("http_429") == frozenset()
    assert covering_words("deadline") == frozenset()
    policy = RetryPolicy(2, frozenset({"connect-failure", "refused-stream"}))
    assert policy.retries("connect", 0) and policy.retries("connect", 1)
    assert not policy.retries("connect", 2)  # retry_count used up
    assert not policy.retries("http_503", 0)  # not named
    assert not policy.retries("reset", 0)  # refused-stream is HTTP/2's; never matches here
    assert not RetryPolicy().retries("connect", 0)


# -- ejection on a fake clock ------------------------------------------------------------------


def test_ejection_after_consecutive_5xx_lasts_base_times_times_ejected() -> None:
    clock = FakeClock()
    d = OutlierDetector(clock, 4, consecutive_5xx=3, base_ejection_s=10.0, max_ejection_percent=50)
    assert not d.record(0, True) and not d.record(0, True)
    assert not d.record(0, False)  # a good answer starts the count again
    assert not d.record(0, True) and not d.record(0, True)
    assert d.record(0, True) and d.ejected(0)
    clock.advance(9.9)
    assert d.ejected(0) and d.ejected_for(0) == pytest.approx(0.1)
    clock.advance(0.1)
    assert not d.ejected(0)  # back, with its count at 0
    assert not d.record(0, True) and not d.record(0, True)
    assert d.record(0, True)  # the second time: twice as long
    clock.advance(19.9)
    assert d.ejected(0)
    clock.advance(0.1)
    assert not d.ejected(0)


def test_ejection_time_is_capped_as_envoy_caps_it() -> None:
    clock = FakeClock()
    d = OutlierDetector(clock, 2, consecutive_5xx=1, base_ejection_s=200.0, max_ejection_percent=50)
    assert d.record(0, True)
    clock.advance(200.0)
    assert d.record(0, True)  # 400 s asked, MAX_EJECTION_S given
    assert d.ejected_for(0) == pytest.approx(MAX_EJECTION_S)


def test_never_more_than_the_percent_and_never_the_last_backend() -> None:
    clock = FakeClock()
    d = OutlierDetector(clock, 4, consecutive_5xx=1, max_ejection_percent=50)
    assert d.record(0, True) and d.record(1, True)
    assert not d.record(2, True)  # 2 of 4 out already: 50%
    assert d.ejected_count() == 2
    everything = OutlierDetector(clock, 3, consecutive_5xx=1, max_ejection_percent=100)
    assert everything.record(0, True) and everything.record(1, True)
    assert not everything.record(2, True)  # one always stays
    none = OutlierDetector(clock, 3, consecutive_5xx=1, max_ejection_percent=0)
    assert not none.record(0, True)
    alone = OutlierDetector(clock, 1, consecutive_5xx=1, max_ejection_percent=100)
    assert not alone.enabled and not alone.record(0, True)
    off = OutlierDetector(clock, 3, consecutive_5xx=0)
    assert not off.record(0, True) and not off.ejected(0)


def test_ejected_backends_are_skipped_by_selection() -> None:
    clock = FakeClock()
    s = BackendSet(
        Providers.model_validate(doc(3, consecutive_5xx=2, max_ejection_percent=34)), clock
    )
    first = s.models["m"][0]
    s.outliers["m"].record(0, True)
    s.outliers["m"].record(0, True)
    assert not s.usable(first) and s.healthy("m")
    assert {s.pick("m").index for _ in range(6)} == {1, 2}
    assert s.inventory()[0]["ejected_for_s"] == pytest.approx(30.0)
    assert s.inventory()[0]["ejections"] == 1
    clock.advance(30.0)
    assert s.usable(first)
    assert s.inventory()[0]["ejected_for_s"] is None


# -- the order of attempts ---------------------------------------------------------------------


def attempts_for(clock: FakeClock, deadline: float | None = None, **rel: Any) -> Attempts:
    providers = Providers.model_validate(
        {
            "defaults": {"default_model": "other"},
            "models": [
                doc(3, **rel)["models"][0],
                {"name": "other", "backend_refs": [{"endpoint": "127.0.0.1:9100"}]},
            ],
        }
    )
    s = BackendSet(providers, clock)
    return Attempts([("m", None), ("other", None)], s, deadline)


def test_retries_go_to_untried_backends_then_the_next_model() -> None:
    clock = FakeClock()
    a = attempts_for(clock, retry_count=2, retry_on="connect-failure")
    seen = []
    for _ in range(3):
        step = a.next()
        assert step is not None
        i, model, _, backend = step
        assert (i, model) == (0, "m")
        assert a.more_after(backend)
        seen.append(backend.index)
        outcome = a.record(backend, AttemptFailed("connect"))
        assert outcome == ("retry" if len(seen) < 3 else "fallback")
    assert sorted(seen) == [0, 1, 2]  # each backend once
    assert [r for _, r in a.retried] == ["connect", "connect"]
    assert a.failed == [("m", "connect")]
    step = a.next()
    assert step is not None and step[1] == "other"
    assert not a.more_after(step[3])  # the last model, no retries: its answer is final
    names = {0: "m_primary", 1: "m_backend-2", 2: "m_backend-3"}
    assert a.headers() == {
        "x-vsr-backend-fallback": "m:connect",
        "x-vsr-backend-retries": f"{names[seen[0]]}:connect,{names[seen[1]]}:connect",
    }
    assert sum(b.retried_from for b in a.backends.models["m"]) == 2


def test_a_failure_retry_on_does_not_name_falls_back_at_once() -> None:
    clock = FakeClock()
    a = attempts_for(clock, retry_count=2, retry_on="connect-failure")
    step = a.next()
    assert step is not None
    assert a.record(step[3], AttemptFailed("http_503")) == "fallback"
    assert a.retried == [] and a.failed == [("m", "http_503")]


def test_no_retry_once_the_callers_deadline_has_passed() -> None:
    clock = FakeClock()
    a = attempts_for(clock, deadline=clock.monotonic() + 1.0, retry_count=2, retry_on="5xx")
    step = a.next()
    assert step is not None
    clock.advance(1.0)
    assert a.record(step[3], AttemptFailed("connect")) == "fallback"
    assert a.next() is None  # nor the next model


def test_retries_on_the_last_model_hand_back_its_own_failure() -> None:
    clock = FakeClock()
    providers = Providers.model_validate(doc(2, retry_count=1, retry_on="reset"))
    a = Attempts([("m", None)], BackendSet(providers, clock), None)
    step = a.next()
    assert step is not None and a.more_after(step[3])  # a retry is possible
    assert a.record(step[3], AttemptFailed("http_503")) == "last"
    assert not a.fell_back_from_last and a.failed == []
    a = Attempts([("m", None)], BackendSet(providers, clock), None)
    step = a.next()
    assert step is not None
    assert a.record(step[3], AttemptFailed("reset")) == "retry"
    step = a.next()
    assert step is not None and not a.more_after(step[3])  # retry_count used up


# -- the health check's settings ---------------------------------------------------------------


def test_health_check_settings_reach_each_backend() -> None:
    s = BackendSet(Providers.model_validate(doc(2, **BALANCE)), FakeClock())
    b = s.models["m"][0]
    assert b.health.every_s == 10.0 and b.health_timeout_s == 2.0 and b.health_path == "/health"
    assert b.ejects_on_5xx
    plain = BackendSet(Providers.model_validate(doc(2)), FakeClock()).models["m"][0]
    assert plain.health.every_s == 5.0 and plain.health_timeout_s == 3.0
    assert plain.health_path is None and not plain.ejects_on_5xx
