"""Consecutive-failure ejection (Envoy's ``outlier_detection``), one set of rules for worker
replicas (timeouts in a row) and LLM backends (5xx in a row).

- :class:`Streak`: a member's run of failures; a success ends it.
- :class:`EjectionRules`: the threshold, the cool-down's base, growth and cap, and the share
  of members that may be out at once (``decide`` never takes out the last one).
- :func:`decide`: whether a member whose streak reached the threshold is ejected now; the first
  rule that holds it back is named (:data:`RULES`, in the order checked):

  1. ``one_worker``: a cluster of one member never ejects it;
  2. ``no_other_replica_answered``: only while another member that is in and serving has
     answered since the streak began (asked only where the caller tracks answers: the pool);
  3. ``max_ejection_percent``: at most ``max_percent`` of the members out at once, rounded
     down (with ``at_least_one``, one may always be out), and never all of them.

The settings that fill these rules are each user's own (``PoolSettings``' outlier_detection
in ms, a model's ``reliability`` in seconds): the numbers here take whatever unit the caller
gives, and give it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RULE_ONE_WORKER = "one_worker"
RULE_NO_OTHER_ANSWERED = "no_other_replica_answered"
RULE_MAX_PERCENT = "max_ejection_percent"
RULES = (RULE_ONE_WORKER, RULE_NO_OTHER_ANSWERED, RULE_MAX_PERCENT)

Growth = Literal["double", "linear"]
_MAX_DOUBLINGS = 40  # a member ejected for days does not build a huge integer


@dataclass
class Streak:
    """A member's run of consecutive failures: how many, and when the first of them began
    (the caller's clock)."""

    count: int = 0
    began_at: float | None = None

    def fail(self, began_at: float | None = None) -> int:
        """One more failure (``began_at``: when it started; kept for the first of the run).
        Returns the run's length."""
        if self.count == 0:
            self.began_at = began_at
        self.count += 1
        return self.count

    def reset(self) -> None:
        self.count, self.began_at = 0, None


@dataclass(frozen=True)
class EjectionRules:
    """One cluster's ejection rules.

    ``threshold``: failures in a row that eject (0: never). ``base``: the first cool-down;
    ``cap``: the longest; ``growth``: ``double`` (base x 2^(n-1), the pool's) or ``linear``
    (base x n, Envoy's) for the n-th ejection. ``max_percent``: the share of members that may
    be out at once; ``at_least_one``: one may be out even when the share rounds to 0."""

    threshold: int
    base: float
    cap: float
    max_percent: int
    growth: Growth = "double"
    at_least_one: bool = False

    @property
    def enabled(self) -> bool:
        return self.threshold > 0

    def reached(self, streak: Streak) -> bool:
        """Whether ``streak`` has reached the threshold (never while ejection is off)."""
        return self.enabled and streak.count >= self.threshold

    def cool_down(self, nth: int) -> float:
        """How long the ``nth`` ejection (1 for the first) lasts: grown from the base, capped.
        Integer inputs give an integer back."""
        steps = max(nth, 1) - 1
        if self.growth == "double":
            grown = self.base * (1 << min(steps, _MAX_DOUBLINGS))
        else:
            grown = self.base * (steps + 1)
        return min(grown, self.cap)

    def max_out(self, members: int) -> int:
        """How many of ``members`` the share lets be ejected at once: rounded down, at least
        one with ``at_least_one`` (``decide`` also never takes out the last member)."""
        share = members * self.max_percent // 100
        return max(1, share) if self.at_least_one else share


@dataclass(frozen=True)
class Decision:
    eject: bool
    rule: str | None = None  # the rule that held the ejection back
    duration: float = 0  # the cool-down, in the rules' unit


def decide(
    rules: EjectionRules,
    *,
    members: int,
    out: int,
    nth: int,
    another_answered: bool = True,
) -> Decision:
    """Whether a member whose streak has reached the threshold is ejected now.

    ``members``: the cluster's size, the member included; ``out``: how many are ejected now;
    ``nth``: which ejection this would be for the member (its cool-down's growth);
    ``another_answered``: whether another member in dispatch answered since its streak
    began (callers that do not track it leave it true)."""
    if members <= 1:
        return Decision(False, RULE_ONE_WORKER)
    if not another_answered:
        return Decision(False, RULE_NO_OTHER_ANSWERED)
    if out + 1 > min(rules.max_out(members), members - 1):
        return Decision(False, RULE_MAX_PERCENT)
    return Decision(True, None, rules.cool_down(nth))
