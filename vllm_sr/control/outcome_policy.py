"""What the control API asks of a posted outcome verdict before it reaches Router Learning
(upstream's ``apiserver/learning_outcome_policy.go``): an ``Idempotency-Key`` header (1 to 256
characters), at most 60 verdicts a minute per principal, and a source the caller cannot
choose. The principal is the kernel's account of the peer (``SO_PEERCRED``: ``uid:<uid>``);
upstream's is its management API's role. Verdicts from the control socket are ``operator``'s,
as upstream attributes every management-API verdict. Sliding window on a clock."""

from __future__ import annotations

from collections import deque

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.control.auth import Peer
from vllm_sr.errors import InvalidRequest, Overloaded

IDEMPOTENCY_HEADER = "idempotency-key"  # as the server keys headers
MAX_KEY = 256
RATE_LIMIT = 60
RATE_WINDOW_S = 60.0
SOURCE = "operator"


class MissingIdempotencyKey(InvalidRequest):
    code = "missing_idempotency_key"


class InvalidIdempotencyKey(InvalidRequest):
    code = "invalid_idempotency_key"


class RateLimited(Overloaded):
    code = "rate_limited"


def principal_of(peer: Peer) -> str:
    return f"uid:{peer.uid}"


class OutcomePolicy:
    def __init__(
        self,
        clock: Clock = SYSTEM_CLOCK,
        limit: int = RATE_LIMIT,
        window_s: float = RATE_WINDOW_S,
    ) -> None:
        self.clock = clock
        self.limit = limit
        self.window_s = window_s
        self._hits: dict[str, deque[float]] = {}

    def enforce(self, key: str | None, principal: str) -> tuple[str, str]:
        """-> (the idempotency key, the source); raises MissingIdempotencyKey,
        InvalidIdempotencyKey or RateLimited (429, Retry-After: when the oldest verdict in
        the window leaves it)."""
        key = (key or "").strip()
        if not key:
            raise MissingIdempotencyKey(
                "header Idempotency-Key is required for learning outcome ingestion "
                "(any string of 1 to 256 characters, one per verdict)"
            )
        if len(key) > MAX_KEY:
            raise InvalidIdempotencyKey(
                f"header Idempotency-Key must be at most {MAX_KEY} characters, got {len(key)}"
            )
        wait = self._allow(principal)
        if wait is not None:
            raise RateLimited(
                f"learning outcome ingestion rate limit exceeded: {self.limit} verdicts per "
                f"{self.window_s:.0f} s for {principal}; retry in {wait:.1f} s",
                retry_after_s=wait,
            )
        return key, SOURCE

    def _allow(self, principal: str) -> float | None:
        """None: counted; else the seconds until the principal may post again."""
        now = self.clock.monotonic()
        hits = self._hits.setdefault(principal, deque())
        while hits and hits[0] <= now - self.window_s:
            hits.popleft()
        if len(hits) >= self.limit:
            return hits[0] + self.window_s - now
        hits.append(now)
        return None
