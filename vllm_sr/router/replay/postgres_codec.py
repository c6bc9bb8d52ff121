"""A router_replay record <-> a row of upstream's table (``router_replay_records``).

The table is upstream's (``pkg/routerreplay/store/postgres.go``): every column it creates, so
an upstream router can share it; vllm-sr adds one, ``vsr_seq BIGSERIAL``, the order its reads
go by (upstream's own inserts get one from the default). A record's fields that have a column
go there (``timestamp``, ``decision``, ``signals``, ``session_id``, ``turn_index``,
``outcomes``, the bodies and flags...); vllm-sr's own fields (``model``, ``response_path``,
``backend_fallbacks``, the byte counts) go in ``route_diagnostics.annotations.vllm_sr``,
upstream's free-form map. A row decodes back to the
record that was written, plus its ``seq``."""

from __future__ import annotations

from datetime import datetime, timedelta

from psycopg.types.json import Jsonb

from vllm_sr.jsontypes import json_object
from vllm_sr.router.replay.store import TIME_FORMAT, Record

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS {t} (
    id VARCHAR(255) PRIMARY KEY,
    timestamp TIMESTAMP NOT NULL,
    request_id VARCHAR(255),
    recipe TEXT,
    decision VARCHAR(255),
    decision_tier INTEGER DEFAULT 0,
    decision_priority INTEGER DEFAULT 0,
    category VARCHAR(255),
    original_model VARCHAR(255),
    selected_model VARCHAR(255),
    reasoning_mode VARCHAR(255),
    signals JSONB,
    projections JSONB,
    projection_scores JSONB,
    signal_confidences JSONB,
    signal_values JSONB,
    tool_trace JSONB,
    projection_trace JSONB,
    session_policy JSONB,
    route_diagnostics JSONB,
    learning JSONB,
    outcomes JSONB,
    request_body TEXT,
    response_body TEXT,
    response_status INTEGER,
    lifecycle_state VARCHAR(32) NOT NULL DEFAULT 'unknown',
    ended_at TIMESTAMP,
    duration_ms BIGINT DEFAULT 0,
    terminal_reason TEXT,
    from_cache BOOLEAN DEFAULT FALSE,
    streaming BOOLEAN DEFAULT FALSE,
    request_body_truncated BOOLEAN DEFAULT FALSE,
    response_body_truncated BOOLEAN DEFAULT FALSE,
    guardrails_enabled BOOLEAN DEFAULT FALSE,
    jailbreak_enabled BOOLEAN DEFAULT FALSE,
    pii_enabled BOOLEAN DEFAULT FALSE,
    prompt TEXT,
    prompt_truncated BOOLEAN DEFAULT FALSE,
    tool_definitions TEXT,
    tool_definitions_truncated BOOLEAN DEFAULT FALSE,
    rag_enabled BOOLEAN DEFAULT FALSE,
    rag_backend VARCHAR(255),
    rag_context_length INTEGER DEFAULT 0,
    rag_similarity_score REAL DEFAULT 0,
    hallucination_enabled BOOLEAN DEFAULT FALSE,
    hallucination_detected BOOLEAN DEFAULT FALSE,
    hallucination_confidence REAL DEFAULT 0,
    hallucination_spans JSONB,
    prompt_tokens INTEGER,
    cached_prompt_tokens INTEGER,
    cache_write_tokens INTEGER,
    completion_tokens INTEGER,
    total_tokens INTEGER,
    actual_cost DOUBLE PRECISION,
    baseline_cost DOUBLE PRECISION,
    cost_savings DOUBLE PRECISION,
    currency VARCHAR(32),
    baseline_model VARCHAR(255),
    session_id VARCHAR(255),
    turn_index INTEGER,
    previous_response_id VARCHAR(255),
    conversation_id VARCHAR(255),
    cache_similarity REAL DEFAULT 0,
    context_token_count INTEGER DEFAULT 0,
    hallucination_span_details JSONB,
    created_at TIMESTAMP DEFAULT NOW()
);
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS recipe TEXT;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS route_diagnostics JSONB;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS lifecycle_state VARCHAR(32) NOT NULL DEFAULT 'unknown';
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS ended_at TIMESTAMP;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS duration_ms BIGINT DEFAULT 0;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS session_id VARCHAR(255);
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS turn_index INTEGER;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS previous_response_id VARCHAR(255);
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS conversation_id VARCHAR(255);
CREATE INDEX IF NOT EXISTS idx_{t}_timestamp ON {t} (timestamp DESC);
CREATE INDEX IF NOT EXISTS idx_{t}_created_at ON {t} (created_at);
CREATE INDEX IF NOT EXISTS idx_{t}_decision_timestamp ON {t} (decision, timestamp DESC);
CREATE INDEX IF NOT EXISTS idx_{t}_session_timestamp ON {t} (session_id, timestamp DESC);
"""
# vllm-sr's column, added only when missing, so that a reconnect runs no DDL that would create
# a sequence
HAS_SEQ = (
    "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'vsr_seq'"
)
ADD_SEQ = """
ALTER TABLE {t} ADD COLUMN vsr_seq BIGSERIAL;
CREATE INDEX IF NOT EXISTS idx_{t}_vsr_seq ON {t} (vsr_seq);
"""

# record field -> its column (the rest go in route_diagnostics.annotations.vllm_sr)
PLAIN = (
    "id",
    "recipe",
    "decision",
    "original_model",
    "selected_model",
    "response_status",
    "lifecycle_state",
    "duration_ms",
    "from_cache",
    "streaming",
)
# record fields with a column that a record may lack (NULL: the field is left out)
OPTIONAL = ("session_id", "turn_index")
BODIES = (
    ("request_body", "request_body_truncated"),
    ("response_body", "response_body_truncated"),
)
BODY_COLUMNS = tuple(k for pair in BODIES for k in pair)
INSERT_COLUMNS = (
    *PLAIN,
    *OPTIONAL,
    "timestamp",
    "ended_at",
    "signals",
    *BODY_COLUMNS,
    "route_diagnostics",
)
SELECT_COLUMNS = (
    *PLAIN,
    *OPTIONAL,
    "timestamp",
    "signals",
    *BODY_COLUMNS,
    "route_diagnostics",
    "outcomes",
    "vsr_seq",
)
COLUMN_FIELDS = {*PLAIN, *OPTIONAL, "timestamp", "signals", *BODY_COLUMNS, "outcomes", "seq"}


def _naive(stamp: str) -> datetime:
    return datetime.strptime(stamp, TIME_FORMAT)


def encode(record: Record) -> tuple[object, ...]:
    """The INSERT_COLUMNS values of ``record``."""
    started = _naive(str(record["timestamp"]))
    ours = {k: v for k, v in record.items() if k not in COLUMN_FIELDS}
    diagnostics = {
        "decision": record.get("decision"),
        "selected_model": record.get("selected_model"),
        "annotations": {"vllm_sr": ours},
    }
    values: list[object] = [record.get(k) for k in (*PLAIN, *OPTIONAL)]
    duration = record.get("duration_ms")
    ms = int(duration) if isinstance(duration, (int, float)) else 0
    values += [started, started + timedelta(milliseconds=ms)]
    values.append(Jsonb(record.get("signals") or {}))
    for body, flag in BODIES:
        values += [record.get(body), bool(record.get(flag, False))]
    values.append(Jsonb(diagnostics))
    return tuple(values)


def decode(row: tuple[object, ...]) -> Record:
    """A SELECT_COLUMNS row -> the record as written, with its ``seq``."""
    cols = dict(zip(SELECT_COLUMNS, row, strict=True))
    rec: Record = {k: cols[k] for k in PLAIN}
    rec.update((k, cols[k]) for k in OPTIONAL if cols[k] is not None)
    stamp = cols["timestamp"]
    rec["timestamp"] = stamp.strftime(TIME_FORMAT) if isinstance(stamp, datetime) else stamp
    rec["signals"] = cols["signals"] or {}
    for body, flag in BODIES:
        if cols[body] is not None:  # a body not captured has no fields at all
            rec[body], rec[flag] = cols[body], bool(cols[flag])
    if cols["outcomes"]:  # upstream's column: the verdicts posted on this chat
        rec["outcomes"] = cols["outcomes"]
    diagnostics = json_object(cols["route_diagnostics"]) or {}
    annotations = json_object(diagnostics.get("annotations")) or {}
    rec.update(json_object(annotations.get("vllm_sr")) or {})
    seq = cols["vsr_seq"]  # the BIGSERIAL column: an int
    rec["seq"] = seq if isinstance(seq, int) else int(str(seq))
    return rec
