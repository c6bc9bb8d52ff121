"""Per-conversation routing state (upstream's router session memory): the model a conversation
is on, its turns and switches, when it was last seen. Bounded (least recently seen evicted
first) and per process; timing on a ``Clock``."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from vllm_sr.clock import SYSTEM_CLOCK, Clock

MAX_CONVERSATIONS = 50_000  # upstream's maxRouterSessions


@dataclass
class _State:
    model: str
    turns: int
    switches: int
    last_seen: float
    decision: str


@dataclass(frozen=True)
class Snapshot:
    """A conversation's state as protection reads it."""

    model: str
    turns: int
    switches: int
    idle_s: float
    decision: str


class ConversationMemory:
    def __init__(
        self,
        clock: Clock = SYSTEM_CLOCK,
        *,
        max_entries: int = MAX_CONVERSATIONS,
        ttl_s: float = 24 * 3600.0,
    ) -> None:
        self.clock = clock
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._states: OrderedDict[str, _State] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def keys(self) -> list[str]:
        """The tracked conversations, least recently seen first."""
        return list(self._states)

    def snapshot(self, key: str) -> Snapshot | None:
        """The conversation's state, None when unknown or older than the TTL (then dropped)."""
        st = self._states.get(key)
        if st is None:
            return None
        idle = max(0.0, self.clock.monotonic() - st.last_seen)
        if idle > self.ttl_s:
            del self._states[key]
            return None
        return Snapshot(st.model, st.turns, st.switches, idle, st.decision)

    def record_decision(self, key: str, model: str, turn_index: int, decision: str) -> None:
        """The model chosen for a turn (upstream's RecordSessionDecision): a turn more (at
        least the request's own turn number), a switch when the model changed."""
        now = self.clock.monotonic()
        st = self._states.get(key)
        if st is None:
            self._make_room()
            st = _State(model, 0, 0, now, decision)
            self._states[key] = st
        elif st.model != model:
            st.switches += 1
        st.turns = turn_index + 1 if turn_index + 1 > st.turns else st.turns + 1
        st.model, st.last_seen, st.decision = model, now, decision
        self._states.move_to_end(key)

    def record_answer(self, key: str, model: str) -> None:
        """The model that answered (a backend fallback may have moved the turn): the
        conversation is on it now (upstream's RecordSessionUsage). No state, no change."""
        st = self._states.get(key)
        if st is None:
            return
        st.model, st.last_seen = model, self.clock.monotonic()
        self._states.move_to_end(key)

    def export(self, key: str) -> dict[str, object] | None:
        """The conversation's state for a shared store (``last_seen`` as wall-clock seconds:
        other processes have other monotonic clocks)."""
        st = self._states.get(key)
        if st is None:
            return None
        wall = self.clock.time() - (self.clock.monotonic() - st.last_seen)
        return {
            "model": st.model,
            "turns": st.turns,
            "switches": st.switches,
            "last_seen": wall,
            "decision": st.decision,
        }

    def hydrate(self, key: str, doc: dict[str, object]) -> None:
        """Take a shared store's state of the conversation as this process's own (a document
        of the wrong shape is ignored)."""
        model, turns, switches = doc.get("model"), doc.get("turns"), doc.get("switches")
        seen, decision = doc.get("last_seen"), doc.get("decision", "")
        if not (isinstance(model, str) and model and isinstance(decision, str)):
            return
        if not (isinstance(turns, int) and isinstance(switches, int)):
            return
        if not isinstance(seen, (int, float)):
            return
        idle = max(0.0, self.clock.time() - float(seen))
        if key not in self._states:
            self._make_room()
        self._states[key] = _State(model, turns, switches, self.clock.monotonic() - idle, decision)
        self._states.move_to_end(key)

    def _make_room(self) -> None:
        while len(self._states) >= self.max_entries:
            self._states.popitem(last=False)
