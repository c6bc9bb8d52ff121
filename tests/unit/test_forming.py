"""Forward forming on measured costs: the table of rates, and which rows form a forward."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sr.worker.engine import Limits
from vllm_sr.worker.forming import ForwardCosts, form, pack

FIXED_S = 0.003  # what one forward costs before its first token (a CPU's shape)
PER_TOKEN_S = 0.00023
SWEET_TOKENS = 256  # past this a token costs more (caches)


def cpu_like(tokens: int) -> float:
    slower = 1.0 + 0.04 * max(0.0, math.log2(tokens / SWEET_TOKENS))
    return FIXED_S + PER_TOKEN_S * tokens * slower


def measured(fn=cpu_like, sizes=range(4, 14)) -> ForwardCosts:  # type: ignore[no-untyped-def]
    costs = ForwardCosts()
    for k in sizes:
        costs.observe(1 << k, fn(1 << k))
    return costs


def drain(lengths: list[int], limits: Limits, costs: ForwardCosts | None) -> list[list[int]]:
    """Form forwards until the queue is empty; returns each forward's row lengths."""
    queue = list(lengths)
    forwards = []
    while queue:
        chosen = form(queue, limits, costs)
        forwards.append([queue[i] for i in chosen])
        keep = set(chosen)
        queue = [n for i, n in enumerate(queue) if i not in keep]
    return forwards


def model_seconds(forwards: list[list[int]]) -> float:
    return sum(cpu_like(len(f) * max(f)) for f in forwards)


# -- the cost table -------------------------------------------------------------------------


def test_rates_are_interpolated_between_measured_sizes() -> None:
    costs = ForwardCosts()
    costs.observe(64, 0.064)  # 1 ms per token
    costs.observe(256, 0.128)  # 0.5 ms per token
    assert costs.rate(128) == pytest.approx(0.00075)  # halfway in log2
    assert costs.cost(128) == pytest.approx(0.096)
    assert costs.cost(16) == pytest.approx(0.064)  # below: no cheaper than the smallest
    assert costs.best_tokens == 256


def test_an_unmeasured_bigger_size_counts_at_the_best_rate_until_measured() -> None:
    costs = ForwardCosts()
    costs.observe(32, 0.032)
    costs.observe(64, 0.032)  # 0.5 ms per token, the best
    assert costs.rate(4096) == pytest.approx(0.0005)
    costs.observe(4096, 4.096)  # measured: 1 ms per token
    assert costs.rate(4096) == pytest.approx(0.001)
    assert costs.best_tokens == 64


def test_each_size_keeps_a_moving_mean_and_ignores_nonsense() -> None:
    costs = ForwardCosts(alpha=0.5)
    costs.observe(100, 0.1)
    costs.observe(100, 0.3)
    assert costs.rate(128) == pytest.approx(0.002)
    costs.observe(100, math.nan)
    costs.observe(0, 1.0)
    assert costs.rate(128) == pytest.approx(0.002)
    assert costs.to_json()["forwards"] == {"128": 2}


def test_alpha_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ForwardCosts(alpha=0)


# -- forming ----------------------------------------------------------------------------------


def test_with_nothing_measured_the_limits_alone_decide() -> None:
    lengths = [10, 50, 11, 49, 12]
    assert form(lengths, Limits(3, 10_000), ForwardCosts()) == pack(lengths, Limits(3, 10_000))
    assert form(lengths, Limits(64, 10_000), None) == [0, 1, 2, 3, 4]


def test_a_few_rows_of_one_length_share_one_forward() -> None:
    assert form([17, 17, 18], Limits(64, 8192), measured()) == [0, 1, 2]


def test_rows_of_one_length_grow_a_forward_to_the_cheapest_size_not_past_it() -> None:
    chosen = form([17] * 64, Limits(64, 8192), measured())
    assert 0 in chosen
    padded = len(chosen) * 17
    assert SWEET_TOKENS / 2 <= padded <= SWEET_TOKENS * 2
    # and the whole queue drains cheaper than in one forward of all 64
    assert model_seconds(drain([17] * 64, Limits(64, 8192), measured())) < cpu_like(64 * 17)


def test_short_rows_are_not_padded_into_a_long_oldest_rows_forward() -> None:
    lengths = [108] + [17] * 8 + [108] * 2
    chosen = form(lengths, Limits(64, 8192), measured())
    assert sorted(lengths[i] for i in chosen) == [108, 108, 108]


def test_a_long_row_is_not_padded_into_a_forward_of_short_ones() -> None:
    lengths = [17, 108, 17, 17, 16]
    chosen = form(lengths, Limits(64, 8192), measured())
    assert [lengths[i] for i in chosen] == [17, 17, 17, 16]


def test_a_mixed_queue_drains_with_less_padding_and_less_time_than_one_forward() -> None:
    lengths = [17, 108] * 16
    forwards = drain(lengths, Limits(64, 8192), measured())
    padded = sum(len(f) * max(f) for f in forwards)
    assert padded <= sum(lengths) * 1.1  # one forward would pad to 32 x 108 = 3.4x
    assert model_seconds(forwards) < 0.7 * cpu_like(len(lengths) * 108)


def test_where_every_forward_costs_the_same_per_token_rows_still_share_forwards() -> None:
    # A fake runner on a fake clock measures 0 s: nothing to gain by splitting, so nothing is.
    costs = ForwardCosts()
    costs.observe(64, 0.0)
    assert form([5, 9, 5, 9], Limits(64, 8192), costs) == [0, 1, 2, 3]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 128), min_size=1, max_size=100),
    st.integers(1, 64),
    st.integers(128, 8192),
)
def test_every_forward_keeps_the_oldest_row_and_both_limits(
    lengths: list[int], seqs: int, budget: int
) -> None:
    chosen = form(lengths, Limits(seqs, budget), measured())
    assert 0 in chosen  # so a row waits for at most as many forwards as rows before it
    assert chosen == sorted(set(chosen))
    assert len(chosen) <= seqs
    assert len(chosen) * max(lengths[i] for i in chosen) <= budget


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([8, 17, 40, 108, 300]), min_size=1, max_size=64))
def test_draining_by_cost_is_never_much_slower_than_by_limits_alone(lengths: list[int]) -> None:
    limits = Limits(64, 8192)
    by_cost = model_seconds(drain(lengths, limits, measured()))
    by_limits = model_seconds(drain(lengths, limits, None))
    assert by_cost <= by_limits * 1.02
