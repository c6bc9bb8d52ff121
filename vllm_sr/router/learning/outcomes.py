"""Router Learning's outcome verdicts (upstream's ``POST /v1/router/outcomes``:
``apiserver/route_router_outcomes.go``, ``extproc/router_learning_outcome_ingest.go``).

An operator (or an evaluator acting for one) says how a routed chat went, naming its
router_replay id: ``good_fit``, ``underpowered``, ``overprovisioned`` or ``failed``. A verdict
on the ``model`` target is filed, as upstream files it, in adaptation's experience of the
model the record says the decision chose, under the record's decision (in its recipe) and the
decision's tier, and so moves what ``routing_sampling`` prefers. Every verdict is also
appended to the record's ``outcomes`` (upstream's field and postgres column); other targets
(``route``, ``policy``, ``stability``, ``provider``, ``router``) go only there, as upstream's.

Each verdict carries an ``Idempotency-Key``: a key already applied is answered as upstream
does (200, ``duplicate: true``, nothing applied again) for 10 minutes after it was applied; a
second request with a key whose first is still being applied waits for it. Validation follows
upstream's messages; the source is never the caller's to say (control/outcome_policy.py)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.errors import Conflict, InvalidRequest, NotFound
from vllm_sr.jsontypes import JsonObject
from vllm_sr.router.learning.adaptation import VERDICTS
from vllm_sr.router.learning.facts import scoped
from vllm_sr.router.replay.store import Record, iso

if TYPE_CHECKING:
    from vllm_sr.router.chat import ChatRouter

SOURCES = ("user", "agent", "eval", "operator", "provider", "router")
TARGETS = ("model", "route", "policy", "stability", "provider", "router")
IDEMPOTENCY_TTL_S = 600.0  # upstream's learningOutcomeIdempotencyTTL
MAX_METADATA = 32
MAX_TARGET_REF = 512


class OutcomeBody(BaseModel):
    """The posted verdict (upstream's RouterOutcomeRequest)."""

    model_config = ConfigDict(extra="forbid")
    replay_id: str = Field(default="", description="the router_replay record's id")
    source: str = Field(default="", description="ignored for attribution; must be known")
    target: str = Field(default="", description="model, route, policy, stability, ...")
    target_ref: str = Field(default="", description="the model the verdict is about")
    verdict: str = Field(default="", description="good_fit, underpowered, ...")
    reason: str = ""
    score: float | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class OutcomeInvalid(InvalidRequest):
    code = "invalid_outcome"


class ReplayNotFound(NotFound):
    code = "replay_not_found"


class OwnershipMismatch(Conflict):
    code = "outcome_ownership_mismatch"


class LearningOff(Conflict):
    """Verdicts need Router Learning on (upstream: no learning runtime, 503; a 503 here would
    tell the caller to come back in a second, which would not help)."""

    code = "router_learning_off"


@dataclass(frozen=True)
class Outcome:
    """A validated verdict with the principal-derived source and the idempotency key."""

    replay_id: str
    target: str
    verdict: str
    key: str
    source: str = "operator"
    target_ref: str = ""
    reason: str = ""
    score: float = 0.0
    metadata: dict[str, str] = field(default_factory=dict)


def normalize(body: OutcomeBody, key: str, source: str) -> Outcome:
    """The verdict as applied, or OutcomeInvalid naming the field and what is accepted."""
    replay_id = body.replay_id.strip()
    if not replay_id:
        raise OutcomeInvalid("replay_id is required (the answer's x-vsr-replay-id)")
    if body.source.strip() and body.source.strip() not in SOURCES:
        raise OutcomeInvalid(f"source {body.source!r}: must be one of {', '.join(SOURCES)}")
    target = body.target.strip()
    if target not in TARGETS:
        raise OutcomeInvalid(f"target {body.target!r}: must be one of {', '.join(TARGETS)}")
    verdict = body.verdict.strip()
    if verdict not in VERDICTS:
        raise OutcomeInvalid(f"verdict {body.verdict!r}: must be one of {', '.join(VERDICTS)}")
    score = 0.0 if body.score is None else body.score
    if not math.isfinite(score) or score < 0 or score > 1:
        raise OutcomeInvalid(f"score {body.score!r}: must be between 0.0 and 1.0")
    return Outcome(
        replay_id,
        target,
        verdict,
        key,
        source=source,
        target_ref=body.target_ref.strip()[:MAX_TARGET_REF],
        reason=body.reason.strip(),
        score=score,
        metadata=_bounded(body.metadata),
    )


def _bounded(metadata: dict[str, str]) -> dict[str, str]:
    """At most 32 entries; keys up to 128 characters, values up to 1024 (upstream's bounds)."""
    out: dict[str, str] = {}
    for key, value in metadata.items():
        if len(out) >= MAX_METADATA:
            break
        key, value = key.strip(), value.strip()
        if key and len(key) <= 128 and len(value) <= 1024:
            out[key] = value
    return out


class IdempotencyKeys:
    """Keys of verdicts applied (for IDEMPOTENCY_TTL_S) or being applied, on a clock."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, ttl_s: float = IDEMPOTENCY_TTL_S) -> None:
        self.clock = clock
        self.ttl_s = ttl_s
        self._applied: dict[str, float] = {}  # key -> when it was applied (monotonic)
        self._pending: dict[str, asyncio.Event] = {}

    def __len__(self) -> int:
        return len(self._applied)

    async def claim(self, key: str) -> bool:
        """True: the caller applies the verdict, then calls :meth:`finish`. False: the key
        was applied already (a duplicate)."""
        while True:
            self._prune()
            if key in self._applied:
                return False
            pending = self._pending.get(key)
            if pending is None:
                self._pending[key] = asyncio.Event()
                return True
            await pending.wait()  # the first applied it (a duplicate) or gave up (ours now)

    def finish(self, key: str, applied: bool) -> None:
        """Release a claim: ``applied`` keeps the key as used; otherwise it may be tried
        again."""
        pending = self._pending.pop(key, None)
        if applied:
            self._applied[key] = self.clock.monotonic()
        if pending is not None:
            pending.set()

    def _prune(self) -> None:
        oldest = self.clock.monotonic() - self.ttl_s
        for key in [k for k, at in self._applied.items() if at <= oldest]:
            del self._applied[key]


async def ingest(chat: ChatRouter, outcome: Outcome) -> JsonObject:
    """Apply one verdict (upstream's UpdateOutcome): ``{"updated", "recorded",
    "duplicate"}``. Raises LearningOff, ReplayNotFound, OwnershipMismatch, or
    StoreUnavailable (the replay store is down; retrying helps)."""
    learning = chat.learning
    if not learning.enabled:
        raise LearningOff(
            "outcome verdicts feed Router Learning, which is off; accepted: "
            "global.router.learning.enabled: true (docs/router.md, Router Learning)"
        )
    keys = learning.state.outcome_keys
    if not await keys.claim(outcome.key):
        return {"updated": 0, "recorded": False, "duplicate": True}
    applied = False
    try:
        record = await chat.replay.get(outcome.replay_id)
        if record is None:
            raise ReplayNotFound(
                f"replay_id {outcome.replay_id!r}: no router_replay record has this id "
                "(never recorded, or dropped by the store's ttl_seconds or max_records)",
                replay_id=outcome.replay_id,
            )
        model = _owned_model(outcome, record) if outcome.target == "model" else None
        target_ref = model or outcome.target_ref
        if not await chat.replay.append_outcome(
            outcome.replay_id, _entry(chat, outcome, target_ref)
        ):
            raise ReplayNotFound(f"replay_id {outcome.replay_id!r}: the record went meanwhile")
        applied = True
        if model is None:
            return {"updated": 0, "recorded": True, "duplicate": False}
        decision, tier = _decision_of(chat, outcome, record)
        learning.state.experience.record_verdict(
            decision, tier, model, outcome.verdict, outcome.score
        )
        return {"updated": 1, "recorded": True, "duplicate": False, "model": model}
    finally:
        keys.finish(outcome.key, applied)


def _entry(chat: ChatRouter, outcome: Outcome, target_ref: str) -> JsonObject:
    """The verdict as the record's ``outcomes`` keep it (upstream's Outcome fields; empty
    ones left out as upstream's JSON omits them)."""
    entry: JsonObject = {
        "timestamp": iso(chat.replay.clock.time()),
        "source": outcome.source,
        "target": outcome.target,
        "target_ref": target_ref,
        "verdict": outcome.verdict,
        "reason": outcome.reason,
        "score": outcome.score,
        "metadata": outcome.metadata,
    }
    keep = {"source", "target", "verdict"}
    return {k: v for k, v in entry.items() if v or k in keep}


def _owned_model(outcome: Outcome, record: Record) -> str:
    """The model the record says was chosen; a verdict naming another is refused."""
    model = str(record.get("selected_model") or "").strip()
    if not model:
        raise OwnershipMismatch(f"replay {outcome.replay_id!r} has no selected model")
    meta = outcome.metadata
    claimed = outcome.target_ref or meta.get("model") or meta.get("selected_model") or ""
    if claimed and claimed != model:
        raise OwnershipMismatch(
            f"target_ref {claimed!r} does not match replay {outcome.replay_id!r}, whose "
            f"selected model is {model!r}; accepted: {model!r} or leave target_ref out",
            selected_model=model,
        )
    return model


def _decision_of(chat: ChatRouter, outcome: Outcome, record: Record) -> tuple[str, int]:
    """The experience's (decision key, tier): metadata ``decision`` / ``recipe`` /
    ``decision_tier`` when given, else the record's decision and recipe, and the decision's
    tier in the running config (0 when it is gone)."""
    meta = outcome.metadata
    decision = meta.get("decision") or str(record.get("decision") or "")
    recipe = meta.get("recipe") or str(record.get("recipe") or "default")
    raw_tier = meta.get("decision_tier", "").strip()
    if raw_tier.lstrip("-").isdigit():
        tier = int(raw_tier)
    else:
        found = chat.decisions.get((recipe, decision))
        tier = found.tier if found is not None else 0
    return scoped(recipe, decision) if decision else "", tier
