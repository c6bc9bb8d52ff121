"""Router Learning's state in one process, kept across config reloads: the conversations
(``memory``, shared through Redis with the redis state store), adaptation's experience, the
outcome verdicts' idempotency keys, and the counters of learning's actions."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_sr.clock import SYSTEM_CLOCK, Clock
from vllm_sr.router.learning.adaptation import ExperienceStore
from vllm_sr.router.learning.memory import ConversationMemory
from vllm_sr.router.learning.outcomes import IdempotencyKeys
from vllm_sr.router.learning.shared_store import SharedConversations

if TYPE_CHECKING:
    from vllm_sr.config.upstream_learning import LearningStateStore


def _time_seed() -> int:
    return time.time_ns()


@dataclass
class LearningState:
    """What Router Learning keeps across requests and reloads (per process)."""

    clock: Clock = SYSTEM_CLOCK
    seed_source: Callable[[], int] = _time_seed
    memory: ConversationMemory = field(init=False)
    experience: ExperienceStore = field(init=False)
    outcome_keys: IdempotencyKeys = field(init=False)  # outcome verdicts' Idempotency-Keys
    # (decision, method, action) -> requests
    actions: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    shared: SharedConversations | None = field(init=False, default=None)
    _shared_conf: LearningStateStore | None = field(init=False, default=None)
    _retired: list[SharedConversations] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.memory = ConversationMemory(self.clock)
        self.experience = ExperienceStore(self.clock)
        self.outcome_keys = IdempotencyKeys(self.clock)

    def use_store(self, store: LearningStateStore | None) -> None:
        """The generation's ``state_store`` (None: local only): the redis client is kept while
        its settings are, else replaced (the old one closed by :meth:`close_retired`)."""
        backend = store.backend if store is not None else None
        conf = store if backend is not None and backend.strip() == "redis" else None
        if conf == self._shared_conf:
            return
        if self.shared is not None:
            self._retired.append(self.shared)
        self.shared = SharedConversations.from_config(conf) if conf is not None else None
        self._shared_conf = conf

    @property
    def store_errors(self) -> int:
        return self.shared.errors if self.shared is not None else 0

    async def close_retired(self) -> None:
        retired, self._retired = self._retired, []
        for store in retired:
            await store.close()

    async def close(self) -> None:
        await self.close_retired()
        if self.shared is not None:
            await self.shared.close()
            self.shared, self._shared_conf = None, None
