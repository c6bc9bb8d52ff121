"""What the control server and its clients share on the wire besides ``vllm_sr.errors``."""

from __future__ import annotations

from vllm_sr.jsonbody import RequestTimeout

__all__ = ["HEARTBEAT", "NDJSON", "STREAM_CLOSED", "STREAM_DROPPED", "RequestTimeout"]

NDJSON = "application/x-ndjson"
HEARTBEAT = "heartbeat"
STREAM_CLOSED = "stream_closed"  # the service is stopping
STREAM_DROPPED = "stream_dropped"  # this reader fell too far behind

# RequestTimeout (408: the client stalled sending its request) is the server's refusal, the
# same on every socket; named here too because the clients map the wire code to it.
