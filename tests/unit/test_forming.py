"""Forward forming on measured costs: the table of rates, and which rows form a forward."""

from __future__ import annotations

import math
import threading

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fakes import FakeRunner, expected_output
from vllm_sr.clock import FakeClock
from vllm_sr.worker.engine import Engine, Job, Limits
from vllm_sr.worker.forming import ForwardCosts, form, pack, probe_shapes

FIXED_S = 0.003  # what one forward costs before its first token (a CPU's shape)
PER_TOKEN_S = 0.00023
SWEET_TOKENS = 256  # past this a token costs a little more (caches), as on a 1-thread CPU


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


# -- the cost model ------------------------------------------------------------------------


def test_the_line_is_fitted_to_what_forwards_of_each_size_took() -> None:
    costs = measured()
    assert costs.fixed_s == pytest.approx(FIXED_S, rel=0.25)
    assert costs.per_token_s == pytest.approx(PER_TOKEN_S, rel=0.25)
    assert costs.cost(1000) == pytest.approx(cpu_like(1000), rel=0.1)
    assert costs.to_json()["by_size"]["256"] == {"ms": round(cpu_like(256) * 1e3, 3), "forwards": 1}


def test_one_size_is_not_enough_to_fit_a_line() -> None:
    costs = ForwardCosts()
    costs.observe(64, 0.02)
    assert not costs.known
    costs.observe(64, 0.02)
    assert not costs.known
    costs.observe(256, 0.05)
    assert costs.known
    assert costs.fixed_s == pytest.approx(0.01)
    assert costs.per_token_s == pytest.approx(0.04 / 192 * 0.75)


def test_each_size_keeps_moving_means_and_ignores_nonsense() -> None:
    costs = ForwardCosts(alpha=0.5)
    costs.observe(100, 0.1)
    costs.observe(100, 0.3)
    assert costs.to_json()["by_size"]["128"] == {"ms": 200.0, "forwards": 2}
    costs.observe(100, math.nan)
    costs.observe(0, 1.0)
    assert costs.to_json()["by_size"] == {"128": {"ms": 200.0, "forwards": 2}}


def test_costs_never_go_negative() -> None:
    costs = ForwardCosts()
    costs.observe(8, 0.010)
    costs.observe(512, 0.008)  # a bigger forward measured faster (noise): all fixed cost
    assert costs.per_token_s == 0.0
    assert costs.fixed_s > 0
    steep = ForwardCosts()
    steep.observe(8, 0.0001)
    steep.observe(512, 0.5)  # no fixed cost to see: a line through zero
    assert steep.fixed_s == 0.0
    assert steep.per_token_s > 0


def test_rows_left_for_later_cost_as_many_forwards_as_the_limits_need() -> None:
    costs = measured()
    one = costs.later(10, 20, Limits(64, 8192))
    assert one == pytest.approx(costs.fixed_s + costs.per_token_s * 200)
    three = costs.later(10, 20, Limits(4, 8192))
    assert three == pytest.approx(3 * costs.fixed_s + costs.per_token_s * 200)


def test_alpha_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ForwardCosts(alpha=0)


# -- pack: the limits alone (nothing measured yet) ------------------------------------------


def test_pack_takes_everything_that_fits() -> None:
    assert pack([5, 7, 3], Limits(8, 100)) == [0, 1, 2]


def test_pack_stops_at_max_num_seqs() -> None:
    chosen = pack([5] * 10, Limits(4, 10_000))
    assert len(chosen) == 4
    assert 0 in chosen


def test_pack_stops_at_padded_token_budget() -> None:
    chosen = pack([10] * 10, Limits(64, 35))
    assert len(chosen) == 3  # 3 x 10 = 30 <= 35 < 40


def test_pack_groups_rows_of_similar_length_around_the_oldest() -> None:
    lengths = [10, 50, 11, 49, 12]
    assert pack(lengths, Limits(3, 10_000)) == [0, 2, 4]


def test_pack_always_takes_the_oldest_row_even_when_long() -> None:
    lengths = [100, 5, 5, 5, 5]
    chosen = pack(lengths, Limits(8, 200))
    assert 0 in chosen
    assert len(chosen) * max(lengths[i] for i in chosen) <= 200
    assert len(chosen) == 2


def test_pack_prefers_shorter_rows_that_do_not_widen_the_batch() -> None:
    # Head is 20 tokens; the 19s fit without raising the padded width, the 30 would.
    chosen = pack([20, 30, 19, 19], Limits(3, 60))
    assert chosen == [0, 2, 3]


# -- forming ----------------------------------------------------------------------------------


def test_with_nothing_measured_the_limits_alone_decide() -> None:
    lengths = [10, 50, 11, 49, 12]
    assert form(lengths, Limits(3, 10_000), ForwardCosts()) == pack(lengths, Limits(3, 10_000))
    assert form(lengths, Limits(64, 10_000), None) == [0, 1, 2, 3, 4]


def test_a_few_rows_of_one_length_share_one_forward() -> None:
    assert form([17, 17, 18], Limits(64, 8192), measured()) == [0, 1, 2]


def test_rows_of_one_length_share_one_forward_up_to_the_limits() -> None:
    assert form([17] * 64, Limits(64, 8192), measured()) == list(range(64))
    chosen = form([17] * 64, Limits(16, 8192), measured())
    assert len(chosen) == 16
    assert 0 in chosen


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
    costs.observe(512, 0.0)
    assert form([5, 9, 5, 9], Limits(64, 8192), costs) == [0, 1, 2, 3]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 128), min_size=1, max_size=100),
    st.integers(1, 64),
    st.integers(128, 8192),
    st.booleans(),
)
def test_every_forward_keeps_the_oldest_row_and_both_limits(
    lengths: list[int], seqs: int, budget: int, known: bool
) -> None:
    limits = Limits(seqs, budget)
    chosen = form(lengths, limits, measured()) if known else pack(lengths, limits)
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


# -- the engine forms forwards on what its own forwards cost ---------------------------------


class TimedRunner(FakeRunner):
    """A fake model whose forwards take ``cpu_like(padded tokens)`` on a fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def forward(self, rows: list[list[int]]) -> numpy.ndarray:
        self.clock.advance(cpu_like(len(rows) * max(map(len, rows))))
        return super().forward(rows)


def run_all(engine: Engine, jobs_rows: list[list[list[int]]]) -> list[Job]:
    """Queue every job, start the engine, wait for all of them, stop it."""
    done = threading.Semaphore(0)
    jobs = [engine.submit(rows, lambda _j: done.release()) for rows in jobs_rows]
    engine.start()
    try:
        for _ in jobs:
            assert done.acquire(timeout=10)
    finally:
        engine.stop(drain_timeout=1)
    return jobs


def test_an_engine_learns_its_costs_and_keeps_long_rows_out_of_short_forwards() -> None:
    clock = FakeClock()
    runner = TimedRunner(clock)
    engine = Engine(runner, Limits(64, 8192), clock=clock)
    for n_rows, width in probe_shapes(512):  # what a worker does before it starts
        engine.measure([[7] * width] * n_rows)
    assert engine.costs.fixed_s == pytest.approx(FIXED_S, rel=0.25)
    runner.forwards.clear()
    jobs_rows = [[[i + 1] * (17 if i % 2 else 108)] for i in range(32)]
    jobs = run_all(engine, jobs_rows)
    for forward in runner.forwards:
        assert len({len(r) for r in forward}) == 1  # one length per forward: no padding
    for job, rows in zip(jobs, jobs_rows, strict=True):
        numpy.testing.assert_array_equal(job.result(), [expected_output(r) for r in rows])
    padded = sum(len(f) * max(map(len, f)) for f in runner.forwards)
    assert padded == sum(len(r[0]) for r in jobs_rows)
    by_size = engine.costs.to_json()["by_size"]
    assert by_size["256"]["forwards"] == 2  # the probe's, and the 16 short rows' forward
    assert by_size["2048"]["forwards"] == 1  # the 16 long rows' forward


def test_an_engine_with_a_forward_target_forms_forwards_to_it_within_the_limits() -> None:
    clock = FakeClock()
    runner = TimedRunner(clock)
    engine = Engine(runner, Limits(64, 8192), clock=clock, forward_tokens=512)
    assert engine.forming_limits.to_json() == {"max_num_seqs": 64, "max_num_batched_tokens": 512}
    assert engine.limits.max_num_batched_tokens == 8192  # what the worker reports is kept
    for n_rows, width in probe_shapes(512):
        engine.measure([[7] * width] * n_rows)
    runner.forwards.clear()
    jobs_rows = [[[i + 1] * 108] for i in range(16)] + [[[7] * 600]]
    jobs = run_all(engine, jobs_rows)
    sizes = sorted(len(f) * max(map(len, f)) for f in runner.forwards)
    # Four 108-token rows per forward (432 padded tokens); the 600-token row, over the target,
    # still runs, alone.
    assert sizes == [432, 432, 432, 432, 600]
    for job, rows in zip(jobs, jobs_rows, strict=True):
        numpy.testing.assert_array_equal(job.result(), [expected_output(r) for r in rows])


@pytest.mark.parametrize("target", [None, 8192, 100_000])
def test_a_forward_target_at_or_over_the_limits_changes_nothing(target: int | None) -> None:
    limits = Limits(64, 8192)
    assert Engine(FakeRunner(), limits, forward_tokens=target).forming_limits is limits


@pytest.mark.parametrize("target", [0, -512])
def test_a_forward_target_below_one_is_refused(target: int) -> None:
    with pytest.raises(ValueError, match=f"forward_tokens: {target}"):
        Engine(FakeRunner(), Limits(64, 8192), forward_tokens=target)


def test_cpu_workers_form_to_the_cpu_target_per_thread_and_gpus_to_their_limits() -> None:
    from vllm_sr.worker.forming import (
        CPU_FORWARD_TOKENS_PER_THREAD,
        CPU_FORWARD_TOKENS_PER_THREAD_HALF,
    )
    from vllm_sr.worker.startup import forward_tokens

    assert forward_tokens("cpu", 1) == CPU_FORWARD_TOKENS_PER_THREAD
    assert forward_tokens("cpu", 3) == 3 * CPU_FORWARD_TOKENS_PER_THREAD
    assert forward_tokens("cpu", 1, "float32") == CPU_FORWARD_TOKENS_PER_THREAD
    # below float32 a CPU token keeps getting cheaper past the float32 target
    assert CPU_FORWARD_TOKENS_PER_THREAD_HALF > CPU_FORWARD_TOKENS_PER_THREAD
    assert forward_tokens("cpu", 1, "bfloat16") == CPU_FORWARD_TOKENS_PER_THREAD_HALF
    assert forward_tokens("cpu", 2, "float16") == 2 * CPU_FORWARD_TOKENS_PER_THREAD_HALF
    assert forward_tokens("cuda", 1, "bfloat16") is None
    assert forward_tokens("rocm", 4) is None
