"""What the control server and its clients share on the wire besides ``vllm_sr.errors``."""

from __future__ import annotations

from vllm_sr.errors import DeadlineExceeded

NDJSON = "application/x-ndjson"
HEARTBEAT = "heartbeat"
STREAM_CLOSED = "stream_closed"  # the service is stopping
STREAM_DROPPED = "stream_dropped"  # this reader fell too far behind


class RequestTimeout(DeadlineExceeded):
    """The client stalled while sending its request (HTTP 408; the service is fine)."""

    code = "request_timeout"
    http_status = 408
    retryable = False
