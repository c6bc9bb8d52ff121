"""What the selectors observe per model: TTFT and TPOT of every proxied answer, streamed ones
included (upstream's ``pkg/latency``), kept on a clock and bounded.

- TTFT: from sending the chat to the backend to the first chunk of a streamed answer, or to the
  whole answer of one that is not streamed (its first token reaches the caller with it).
- TPOT: the answer's whole time over its completion tokens (upstream's ``completionLatency /
  completion_tokens``): ``usage.completion_tokens`` when the backend reports it, else, for a
  stream, the chunks that carried content. An answer of 400 or more, a stream that broke, or an
  answer with no completion tokens gives no TPOT.
- Per model and metric, the last ``max_samples`` observations (upstream keeps 1000), none older
  than ``max_age_s`` (ours: upstream keeps them until replaced). A percentile from 3 or more
  of them is the linearly interpolated one; from 1 or 2 it is their moving average
  (alpha 0.3), as upstream.

In-process, like upstream's (a package-level cache in each router replica, not shared across
replicas). Requests in flight are the backends' own counts (``Backend.inflight``)."""

from __future__ import annotations

import bisect
import json
import re
from collections import deque
from typing import TYPE_CHECKING

from vllm_sr.jsontypes import JsonObject, json_object

if TYPE_CHECKING:
    from vllm_sr.clock import Clock
    from vllm_sr.router.backend_proxy import AnswerTap

MAX_SAMPLES = 1000
MAX_AGE_S = 600.0
EMA_ALPHA = 0.3
MIN_FOR_PERCENTILE = 3
MAX_LINE_BYTES = 1 << 20  # an SSE line longer than this is not parsed for tokens
SHOWN_PERCENTILES = (50, 95)


def _moving_average(values: list[float]) -> float:
    avg = values[0]
    for v in values[1:]:
        avg = EMA_ALPHA * v + (1 - EMA_ALPHA) * avg
    return avg


def _interpolated(ordered: list[float], percentile: int) -> float:
    index = percentile / 100.0 * (len(ordered) - 1)
    lower = int(index)
    if lower + 1 >= len(ordered):
        return ordered[-1]
    weight = index - lower
    return ordered[lower] * (1 - weight) + ordered[lower + 1] * weight


def percentile_of(values: list[float], percentile: int) -> float | None:
    """Upstream's reading of a window (values in arrival order): None when empty; the moving
    average for fewer than 3; else the linearly interpolated ``percentile`` (1-100)."""
    if not values:
        return None
    if len(values) < MIN_FOR_PERCENTILE:
        return _moving_average(values)
    return _interpolated(sorted(values), percentile)


class Window:
    """One model's recent observations of one metric, in seconds, in arrival order and (so a
    read needs no sort) in ascending order."""

    def __init__(self, max_samples: int, max_age_s: float) -> None:
        self.max_samples = max_samples
        self.max_age_s = max_age_s
        self.samples: deque[tuple[float, float]] = deque()  # (at, value)
        self.ordered: list[float] = []

    def _drop_oldest(self) -> None:
        _, value = self.samples.popleft()
        del self.ordered[bisect.bisect_left(self.ordered, value)]

    def add(self, now: float, value: float) -> None:
        if len(self.samples) >= self.max_samples:
            self._drop_oldest()
        self.samples.append((now, value))
        bisect.insort(self.ordered, value)

    def prune(self, now: float) -> int:
        """Drop what is older than ``max_age_s``; -> how many are left."""
        while self.samples and now - self.samples[0][0] > self.max_age_s:
            self._drop_oldest()
        return len(self.samples)

    def percentile(self, now: float, percentile: int) -> float | None:
        """As :func:`percentile_of` on what is left after pruning."""
        left = self.prune(now)
        if not left:
            return None
        if left < MIN_FOR_PERCENTILE:
            return _moving_average([v for _, v in self.samples])
        return _interpolated(self.ordered, percentile)


class ModelObservations:
    """TTFT and TPOT windows per model."""

    def __init__(
        self, clock: Clock, *, max_samples: int = MAX_SAMPLES, max_age_s: float = MAX_AGE_S
    ) -> None:
        self.clock = clock
        self.max_samples = max_samples
        self.max_age_s = max_age_s
        self._windows: dict[tuple[str, str], Window] = {}

    def record(
        self, model: str, *, ttft_s: float | None = None, tpot_s: float | None = None
    ) -> None:
        now = self.clock.monotonic()
        for metric, value in (("ttft", ttft_s), ("tpot", tpot_s)):
            if value is None or value <= 0:
                continue  # upstream skips non-positive values
            key = (model, metric)
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = Window(self.max_samples, self.max_age_s)
            window.add(now, value)

    def _read(self, model: str, metric: str, percentile: int) -> float | None:
        window = self._windows.get((model, metric))
        if window is None or not 1 <= percentile <= 100:
            return None
        return window.percentile(self.clock.monotonic(), percentile)

    def ttft(self, model: str, percentile: int) -> float | None:
        """Seconds, or None with no observation in the window."""
        return self._read(model, "ttft", percentile)

    def tpot(self, model: str, percentile: int) -> float | None:
        """Seconds per output token, or None with no observation in the window."""
        return self._read(model, "tpot", percentile)

    def snapshot(self) -> dict[str, JsonObject]:
        """For the inventory: per model, each metric's sample count and p50/p95 in ms."""
        now = self.clock.monotonic()
        out: dict[str, JsonObject] = {}
        for (model, metric), window in sorted(self._windows.items()):
            left = window.prune(now)
            if not left:
                continue
            entry: JsonObject = {"samples": left}
            for p in SHOWN_PERCENTILES:
                value = window.percentile(now, p)
                entry[f"p{p}_ms"] = None if value is None else round(value * 1000.0, 3)
            out.setdefault(model, {})[f"{metric}"] = entry
        return out

    def timing(self, model: str, started: float, inner: AnswerTap | None) -> AnswerTiming:
        """The tap that times one proxied answer of ``model`` sent at ``started``."""
        return AnswerTiming(self, model, started, inner)


class AnswerTiming:
    """An answer tap that records the answer's TTFT and TPOT, passing everything on to
    ``inner`` (the response cache's writer, or None)."""

    def __init__(
        self,
        observations: ModelObservations,
        model: str,
        started: float,
        inner: AnswerTap | None,
    ) -> None:
        self.observations = observations
        self.model = model
        self.started = started
        self.inner = inner
        self.first_at: float | None = None
        self.content_chunks = 0
        self.usage_tokens: int | None = None
        self._partial = b""

    def _elapsed(self) -> float:
        return self.observations.clock.monotonic() - self.started

    def whole(self, status: int, body: bytes) -> None:
        if self.inner is not None:
            self.inner.whole(status, body)
        if status >= 400:
            return
        elapsed = self._elapsed()
        tokens = _whole_tokens(body)
        self.observations.record(
            self.model, ttft_s=elapsed, tpot_s=elapsed / tokens if tokens else None
        )

    def chunk(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.chunk(data)
        if self.first_at is None:
            self.first_at = self._elapsed()
            self.observations.record(self.model, ttft_s=self.first_at)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial = b""
        for line in lines:
            self._line(line.strip())

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        event = _json(line[5:].strip())
        if event is None:
            return
        tokens = _completion_tokens(event)
        if tokens:
            self.usage_tokens = tokens
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
                self.content_chunks += 1

    def finish(self) -> None:
        if self.inner is not None:
            self.inner.finish()
        if self._partial:
            self._line(self._partial.strip())
            self._partial = b""
        tokens = self.usage_tokens or self.content_chunks
        if tokens:
            self.observations.record(self.model, tpot_s=self._elapsed() / tokens)


def _json(raw: bytes) -> JsonObject | None:
    try:
        return json_object(json.loads(raw))
    except ValueError:
        return None


# A whole answer's ``usage.completion_tokens``, found without parsing the answer (its only
# unescaped ``"completion_tokens"`` key in a chat completion is usage's; a quote inside a JSON
# string is escaped).
_COMPLETION_TOKENS = re.compile(rb'(?<!\\)"completion_tokens"\s*:\s*([0-9]{1,9})\b')


def _whole_tokens(body: bytes) -> int:
    found = _COMPLETION_TOKENS.search(body)
    return int(found.group(1)) if found is not None else 0


def _completion_tokens(doc: JsonObject | None) -> int:
    usage = doc.get("usage") if doc is not None else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0
