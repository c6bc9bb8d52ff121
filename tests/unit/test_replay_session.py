"""router_replay's session metadata (vllm_sr/router/replay/session.py): upstream's session id
sources in its order, its digests, and the turn index."""

from __future__ import annotations

import hashlib

from vllm_sr.router.replay.session import session_fields, session_id, turn_index


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


CHAT = {
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "x" * 150},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "and then?"}]},
    ]
}


def test_the_session_header_wins_then_claude_codes() -> None:
    both = {"x-session-id": " s-1 ", "x-claude-code-session-id": "cc-9"}
    assert session_id(CHAT, both) == "s-1"
    assert session_id(CHAT, {"x-session-id": "  ", "x-claude-code-session-id": "cc-9"}) == "cc-9"


def test_a_session_id_too_long_for_upstreams_column_is_kept_as_its_digest() -> None:
    assert session_id(CHAT, {"x-session-id": "s" * 255}) == "s" * 255
    long = "s" * 256
    assert session_id(CHAT, {"x-session-id": long}) == (
        "sha256:" + hashlib.sha256(long.encode()).hexdigest()
    )


def test_a_caller_and_first_user_message_digest_cut_at_100_bytes() -> None:
    sid = session_id(CHAT, {"x-authz-user-id": "alice"})
    assert sid == "cc-" + _h("alice:" + "x" * 100)
    # the same conversation one turn on keeps its id; another caller gets another
    longer = {"messages": [*CHAT["messages"], {"role": "assistant", "content": "more"}]}
    assert session_id(longer, {"x-authz-user-id": "alice"}) == sid
    assert session_id(CHAT, {"x-authz-user-id": "bob"}) != sid


def test_without_a_caller_every_message_is_fingerprinted() -> None:
    sid = session_id(CHAT, {})
    want = "|".join(["system:be brief", "user:" + "x" * 100, "assistant:ok", "user:and then?"])
    assert sid == "cc-full-" + _h(want)


def test_without_messages_the_request_id_then_nothing() -> None:
    assert session_id({}, {"x-request-id": "r-7"}) == "rid-" + _h("rid:r-7")
    assert session_id({"messages": "nope"}, {}) is None


def test_turn_index_counts_the_assistant_turns_before_this_one() -> None:
    assert turn_index(CHAT) == 1
    assert turn_index({"messages": [{"role": "user", "content": "hi"}]}) == 0
    assert session_fields({}, {}) == {"turn_index": 0}  # no session id: the field is left out
    assert session_fields(CHAT, {"x-session-id": "s"}) == {"session_id": "s", "turn_index": 1}
