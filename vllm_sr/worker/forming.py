"""Which queued rows form the next forward, from what forwards of each size cost here.

Pure logic: no torch, no threads. ``ForwardCosts`` keeps the seconds per padded token of a
forward by size, measured (probe forwards at startup, then every real forward). ``form`` picks
the next forward's rows:

- The oldest queued row always goes, so each forward takes the head of the queue and no row
  waits for more forwards than there are rows queued before it.
- Among the rows sorted by length, the forward grows around the oldest one, a row at a time
  (the next shorter or the next longer), while that lowers the estimated cost of the whole
  queue: this forward, plus the rows left out run later (shorter ones together, longer ones
  together). Rows of one length so grow a forward up to the size where a token is cheapest on
  this worker; a long row is not padded into a forward of short ones (nor short rows into a
  long one's) when that padding costs more than a forward of their own.

Sizes never measured count at the best rate seen (so a size not seen yet is tried, once, and
then known); with nothing measured yet ``form`` falls back to ``pack`` (limits alone).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any, Protocol

EWMA_ALPHA = 0.2  # weight of the newest forward in its size's rate


class Limits(Protocol):
    @property
    def max_num_seqs(self) -> int: ...

    @property
    def max_num_batched_tokens(self) -> int: ...


class ForwardCosts:
    """Seconds per padded token of a forward, by size (log2 buckets of padded tokens): each
    bucket keeps an exponentially weighted mean of what forwards of about that size took.
    Between measured sizes the rate is interpolated (in log2 of the size); below the smallest
    a forward costs what the smallest did; above the largest, a token costs the best rate
    seen."""

    def __init__(self, alpha: float = EWMA_ALPHA) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha: {alpha!r} is not in (0, 1]")
        self.alpha = alpha
        self._rate: dict[int, float] = {}  # bucket exponent -> seconds per padded token
        self._keys: list[int] = []
        self._samples: dict[int, int] = {}
        self.best_rate = 0.0
        self.best_tokens = 0

    @property
    def known(self) -> bool:
        return bool(self._rate)

    def observe(self, padded: int, seconds: float) -> None:
        """One forward of ``padded`` tokens took ``seconds``."""
        if padded < 1 or not math.isfinite(seconds):
            return
        rate = max(0.0, seconds) / padded
        k = round(math.log2(padded))
        old = self._rate.get(k)
        if old is None:
            self._rate[k] = rate
            bisect.insort(self._keys, k)
        else:
            self._rate[k] = old + self.alpha * (rate - old)
        self._samples[k] = self._samples.get(k, 0) + 1
        best = min(self._keys, key=lambda key: (self._rate[key], -key))
        self.best_rate = self._rate[best]
        self.best_tokens = 1 << best

    def rate(self, padded: int) -> float:
        keys = self._keys
        if not keys:
            return 0.0
        x = math.log2(max(padded, 1))
        i = bisect.bisect_left(keys, x)
        if i == 0:
            # Below the smallest size measured a forward costs no less than that one did (what
            # a forward costs before its first token dominates there).
            smallest = keys[0]
            return self._rate[smallest] * (1 << smallest) / max(padded, 1)
        if i == len(keys):
            return self.best_rate
        lo, hi = keys[i - 1], keys[i]
        r_lo, r_hi = self._rate[lo], self._rate[hi]
        return r_lo + (r_hi - r_lo) * (x - lo) / (hi - lo)

    def cost(self, padded: int) -> float:
        """Estimated seconds of one forward of ``padded`` tokens."""
        return padded * self.rate(padded) if padded > 0 else 0.0

    def later(self, rows: int, width: int) -> float:
        """Estimated seconds to run ``rows`` rows padded to ``width`` in later forwards: one
        forward if that is no bigger than the cheapest size, else forwards of that size."""
        tokens = rows * width
        if tokens <= 0:
            return 0.0
        if tokens <= self.best_tokens:
            return self.cost(tokens)
        return tokens * self.best_rate

    def to_json(self) -> dict[str, Any]:
        # Copies first: the forward thread may add a size while another thread reads.
        rates, samples = dict(self._rate), dict(self._samples)
        return {
            "best_tokens": self.best_tokens,
            "best_ms_per_1k_tokens": round(self.best_rate * 1e6, 3),
            "ms_per_1k_tokens": {str(1 << k): round(rates[k] * 1e6, 3) for k in sorted(rates)},
            "forwards": {str(1 << k): samples.get(k, 0) for k in sorted(rates)},
        }


PROBE_WIDTH = 64  # tokens per probe row (rows of real requests are mostly shorter)


def probe_shapes(max_tokens: int, smallest: int = 8) -> list[tuple[int, int]]:
    """(rows, width) of the startup probe forwards: padded sizes doubling from ``smallest``
    up to ``max_tokens``, rows of up to ``PROBE_WIDTH`` tokens."""
    shapes = []
    tokens = smallest
    while tokens <= max_tokens:
        width = min(tokens, PROBE_WIDTH)
        shapes.append((tokens // width, width))
        tokens *= 2
    return shapes


def pack(lengths: Sequence[int], limits: Limits) -> list[int]:
    """The rows (given by their lengths, oldest first) that go into the next forward when
    nothing is known of costs: the oldest always, then a window around it among the rows
    sorted by length (first towards shorter rows, which do not raise the padded width, then
    towards longer ones) while both limits hold. Returns the chosen indices in queue order."""
    n = len(lengths)
    if n == 0:
        return []
    cap = limits.max_num_seqs
    budget = limits.max_num_batched_tokens
    if n <= cap and n * max(lengths) <= budget:
        return list(range(n))
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    head = order.index(0)
    lo = hi = head
    width = lengths[order[head]]
    while lo > 0 and (hi - lo + 2) <= cap and (hi - lo + 2) * width <= budget:
        lo -= 1
    while hi + 1 < n:
        new_width = lengths[order[hi + 1]]
        count = hi - lo + 2
        if count > cap or count * new_width > budget:
            break
        hi += 1
        width = new_width
    return sorted(order[lo : hi + 1])


def form(lengths: Sequence[int], limits: Limits, costs: ForwardCosts | None) -> list[int]:
    """The rows (given by their lengths, oldest first) of the next forward, in queue order
    (see the module doc)."""
    n = len(lengths)
    if n <= 1:
        return list(range(n))
    if costs is None or not costs.known:
        return pack(lengths, limits)
    cap = limits.max_num_seqs
    budget = limits.max_num_batched_tokens
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    sorted_len = [lengths[i] for i in order]
    longest = sorted_len[-1]
    lo = hi = order.index(0)
    width = sorted_len[lo]

    def total(lo: int, hi: int, width: int) -> float:
        # this forward + the shorter rows left out + the longer rows left out
        return (
            costs.cost((hi - lo + 1) * width)
            + (costs.later(lo, sorted_len[lo - 1]) if lo > 0 else 0.0)
            + (costs.later(n - 1 - hi, longest) if hi < n - 1 else 0.0)
        )

    # Grow one row at a time towards whichever side costs less, to the limits, and keep the
    # cheapest window seen: the total is not monotone along the way (two forwards of two rows
    # can look cheaper than three and one, while one of four is cheaper still).
    current = total(lo, hi, width)
    chosen = (current, lo, hi)
    while hi - lo + 1 < cap:
        count = hi - lo + 2
        step: tuple[float, int, int, int] | None = None
        if lo > 0 and count * width <= budget:
            step = (total(lo - 1, hi, width), lo - 1, hi, width)
        if hi < n - 1:
            wider = sorted_len[hi + 1]
            if count * wider <= budget:
                option = total(lo, hi + 1, wider)
                if step is None or option < step[0]:
                    step = (option, lo, hi + 1, wider)
        if step is None:
            break
        current, lo, hi, width = step
        # Ties join: a forward has a fixed cost the per-token rates may not show.
        if current <= chosen[0] + 1e-9 * abs(chosen[0]):
            chosen = (current, lo, hi)
        elif costs.cost((hi - lo + 1) * width) > chosen[0]:
            break  # this forward alone now costs more than the best plan: growing cannot help
    _, lo, hi = chosen
    return sorted(order[lo : hi + 1])
