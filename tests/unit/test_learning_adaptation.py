"""Router Learning's adaptation (routing_sampling, pure, seeded): cold-start models are tried
first when sampling; a model whose answers fail loses to one that answers; the same seed gives
the same choice and different seeds explore; observe computes without changing the model;
bypass does nothing."""

from __future__ import annotations

from vllm_sr.clock import FakeClock
from vllm_sr.router.learning.adaptation import ExperienceStore, routing_sampling

MODELS = ["a", "b"]


def pick(store: ExperienceStore, mode: str = "apply", *, sampling: bool, seed: int = 1) -> tuple:
    got = routing_sampling(
        mode,
        MODELS,
        lambda m: store.snapshot("d", 0, m),
        "a",
        "decision",
        {},
        sampling_allowed=sampling,
        seed=seed,
    )
    return got.model, got.policy.action, got.policy.reason


def observed(store: ExperienceStore, *models: str) -> None:
    for m in models:
        store.record_answer("d", 0, m, latency_s=0.1)


def test_sampling_tries_a_model_never_observed_first() -> None:
    store = ExperienceStore(FakeClock())
    store.record_answer("d", 0, "a")  # answered (no latency known)
    assert pick(store, sampling=True) == ("b", "propose_switch", "cold_start")
    # without sampling (a tool loop, observe), the posterior keeps the base model
    assert pick(store, sampling=False)[:2] == ("a", "keep_base")


def test_failures_move_the_choice_to_the_model_that_answers() -> None:
    store = ExperienceStore(FakeClock())
    observed(store, "a", "b")
    assert pick(store, sampling=False) == ("a", "keep_base", "base_best")
    for _ in range(3):
        store.record_answer("d", 0, "a", failed=True)
    assert pick(store, sampling=False) == ("b", "propose_switch", "posterior_win")


def test_experience_falls_back_from_decision_to_overall() -> None:
    store = ExperienceStore(FakeClock())
    store.record_verdict("other", 0, "a", "good_fit", 3)
    snap = store.snapshot("d", 0, "a")  # d never saw a: the overall record
    assert snap.good_fit == 3 and snap.last_updated is not None
    assert store.snapshot("d", 0, "zzz").last_updated is None


def test_the_same_seed_gives_the_same_choice_and_seeds_explore() -> None:
    store = ExperienceStore(FakeClock())
    observed(store, "a", "b")
    runs = [pick(store, sampling=True, seed=s)[0] for s in range(40)]
    assert runs == [pick(store, sampling=True, seed=s)[0] for s in range(40)]
    assert set(runs) == {"a", "b"}  # Thompson sampling explores both


def test_observe_computes_and_keeps_the_base_and_bypass_does_nothing() -> None:
    store = ExperienceStore(FakeClock())
    observed(store, "a", "b")
    for _ in range(3):
        store.record_answer("d", 0, "a", failed=True)
    assert pick(store, "observe", sampling=True) == ("a", "observe", "observe_only")
    got = routing_sampling(
        "observe",
        MODELS,
        lambda m: store.snapshot("d", 0, m),
        "a",
        "decision",
        {},
        sampling_allowed=True,
        seed=1,
    )
    assert got.scores["b"] > got.scores["a"]  # computed: b would have won
    assert pick(store, "bypass", sampling=True) == ("a", "bypass", "decision_bypass")


def test_a_dearer_winner_must_beat_the_base_by_its_extra_cost() -> None:
    store = ExperienceStore(FakeClock())
    observed(store, "a", "b")
    store.record_verdict("d", 0, "a", "good_fit")  # a: mean 0.6
    store.record_verdict("d", 0, "b", "good_fit", 2)  # b: mean 0.667

    def choose(costs: dict[str, float]) -> str:
        return routing_sampling(
            "apply",
            MODELS,
            lambda m: store.snapshot("d", 0, m),
            "a",
            "decision",
            costs,
            sampling_allowed=False,
            seed=0,
        ).model

    assert choose({}) == "b"
    assert choose({"a": 1.0, "b": 1.0}) == "b"
    # b costs 100x: its 0.04 penalty plus the same again as margin outweigh its 0.067 lead
    assert choose({"a": 0.01, "b": 1.0, "x": 0.0}) == "a"
