"""Retries of one chat on another backend of the same model (``reliability.retry_count`` /
``retry_on``, upstream's Envoy ``retry_policy``), before the first byte reached the caller.

A failure's reason (:class:`~vllm_sr.router.backend_proxy.AttemptFailed`) is matched against
Envoy's words as Envoy means them for an HTTP/1.1 backend:

- ``connect-failure``: the connection could not be opened (``connect``);
- ``reset``: the backend dropped the connection or the stream broke before its first chunk
  (``reset``, ``stream_first_chunk``);
- ``gateway-error``: an answer 502, 503 or 504, or any of the above (Envoy retries a reset or
  a connect failure under gateway-error too);
- ``5xx``: any 5xx answer, or any of the above;
- ``refused-stream``: an HTTP/2 stream refused by the backend; vllm-sr's backends speak
  HTTP/1.1, where that cannot happen, so the word is accepted and never matches (as with
  Envoy and an HTTP/1.1 upstream).

Never retried: a 429 (no Envoy word above covers it; the model fallback still does), and the
caller's deadline running out (``deadline``). Unlike Envoy, a retry never goes to a backend
this chat already tried, and goes at once (no back-off): the chat waits in the caller's
deadline, and another backend is not the one that failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_sr.config.routing_providers import ProviderModel

# reason -> the retry_on words that cover it
_COVERED_BY: dict[str, frozenset[str]] = {
    "connect": frozenset({"connect-failure", "gateway-error", "5xx"}),
    "reset": frozenset({"reset", "gateway-error", "5xx"}),
    "stream_first_chunk": frozenset({"reset", "gateway-error", "5xx"}),
    "http_502": frozenset({"gateway-error", "5xx"}),
    "http_503": frozenset({"gateway-error", "5xx"}),
    "http_504": frozenset({"gateway-error", "5xx"}),
}


def covering_words(reason: str) -> frozenset[str]:
    """The retry_on words under which a failure with ``reason`` is retried."""
    if reason in _COVERED_BY:
        return _COVERED_BY[reason]
    if reason.startswith("http_5"):
        return frozenset({"5xx"})
    return frozenset()


@dataclass(frozen=True)
class RetryPolicy:
    """A model's retries: at most ``count`` more backends after the first, for the failures
    whose reason ``retry_on`` covers."""

    count: int = 0
    retry_on: frozenset[str] = frozenset()

    @classmethod
    def of(cls, model: ProviderModel) -> RetryPolicy:
        rel = model.reliability
        if rel is None or rel.retry_count == 0:
            return cls()
        return cls(rel.retry_count, frozenset(rel.retry_on_words))

    def retries(self, reason: str, retried: int) -> bool:
        """Whether a failure with ``reason`` is retried after ``retried`` retries so far."""
        return retried < self.count and bool(covering_words(reason) & self.retry_on)


NO_RETRY = RetryPolicy()
