"""Which queued rows form the next forward, from what forwards cost on this worker.

Pure logic: no torch, no threads. ``ForwardCosts`` models a forward's seconds as a fixed cost
plus a cost per padded token, fitted to what forwards of each size took here (probe forwards
at startup, then every real forward). ``form`` picks the next forward's rows:

- The oldest queued row always goes, so each forward takes the head of the queue and no row
  waits for more forwards than there are rows queued before it.
- Among the rows sorted by length, the forward grows around the oldest one, a row at a time
  (the next shorter or the next longer), to the limits, and keeps the window that gives the
  lowest estimated cost of the whole queue: this forward, plus the rows left out run later
  (the shorter ones together, the longer ones together). Rows of one length so share one
  forward up to the limits (another forward would only add its fixed cost); a long row is
  not padded into a forward of short ones, nor short rows into a long one's, when that
  padding costs more than a forward of their own.

Until two sizes have been measured ``form`` falls back to ``pack`` (the limits alone).

Why a straight line and not a curve per size: on a 1-thread CPU a token costs a few per cent
more in forwards past a few hundred tokens, but a forward's time inside a busy worker varies
by more than that (the HTTP thread and other processes share the core), and a table per size
chased that noise (it once grew forwards to 4096 tokens on a lucky measurement). The fixed
cost and the per-token cost are what padding decisions need, and they are stable. The size
past which a CPU token costs more is set instead (``CPU_FORWARD_TOKENS_PER_THREAD``): the
engine forms CPU forwards to that many padded tokens per thread, within the limits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

EWMA_ALPHA = 0.2  # weight of the newest forward in its size's means


class Limits(Protocol):
    @property
    def max_num_seqs(self) -> int: ...

    @property
    def max_num_batched_tokens(self) -> int: ...


class ForwardCosts:
    """A forward's seconds as ``fixed_s + per_token_s x padded tokens``. Forwards are grouped
    by size (log2 buckets of padded tokens); each bucket keeps moving means of its forwards'
    tokens and seconds, and the line is fitted to the buckets' means, each weighted by the
    inverse of its square (relative error, so small forwards count as much as big ones)."""

    def __init__(self, alpha: float = EWMA_ALPHA) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha: {alpha!r} is not in (0, 1]")
        self.alpha = alpha
        self._means: dict[int, tuple[float, float]] = {}  # bucket -> (tokens, seconds)
        self._samples: dict[int, int] = {}
        self.fixed_s = 0.0
        self.per_token_s = 0.0

    @property
    def known(self) -> bool:
        """Two sizes or more measured: the line is fitted."""
        return len(self._means) >= 2

    def observe(self, padded: int, seconds: float) -> None:
        """One forward of ``padded`` tokens took ``seconds``."""
        if padded < 1 or not math.isfinite(seconds):
            return
        seconds = max(0.0, seconds)
        k = round(math.log2(padded))
        old = self._means.get(k)
        if old is None:
            self._means[k] = (float(padded), seconds)
        else:
            a = self.alpha
            self._means[k] = (old[0] + a * (padded - old[0]), old[1] + a * (seconds - old[1]))
        self._samples[k] = self._samples.get(k, 0) + 1
        self._fit()

    def _fit(self) -> None:
        points = list(self._means.values())
        if len(points) < 2:
            return
        # Weighted least squares of c = a + b t, weights 1 / c^2.
        sw = st = sc = stt = stc = 0.0
        for t, c in points:
            w = 1.0 / (c * c) if c > 0 else 1.0
            sw += w
            st += w * t
            sc += w * c
            stt += w * t * t
            stc += w * t * c
        det = sw * stt - st * st
        if det <= 0:
            return
        b = (sw * stc - st * sc) / det
        a = (sc - b * st) / sw
        if b < 0:  # bigger forwards no dearer: all fixed cost
            a, b = sc / sw, 0.0
        elif a < 0:  # no fixed cost seen: a line through zero
            a, b = 0.0, stc / stt
        self.fixed_s, self.per_token_s = a, b

    def cost(self, padded: int) -> float:
        """Estimated seconds of one forward of ``padded`` tokens (0 for none)."""
        return self.fixed_s + self.per_token_s * padded if padded > 0 else 0.0

    def later(self, rows: int, width: int, limits: Limits) -> float:
        """Estimated seconds to run ``rows`` rows padded to ``width`` in as few forwards as
        the limits allow."""
        if rows <= 0:
            return 0.0
        per_forward = max(1, min(limits.max_num_seqs, limits.max_num_batched_tokens // width))
        forwards = -(-rows // per_forward)
        return forwards * self.fixed_s + self.per_token_s * rows * width

    def to_json(self) -> dict[str, Any]:
        # Copies first: the forward thread may add a size while another thread reads.
        means, samples = dict(self._means), dict(self._samples)
        return {
            "fixed_ms": round(self.fixed_s * 1e3, 3),
            "ms_per_1k_tokens": round(self.per_token_s * 1e6, 3),
            "by_size": {
                str(1 << k): {"ms": round(means[k][1] * 1e3, 3), "forwards": samples.get(k, 0)}
                for k in sorted(means)
            },
        }


PROBE_WIDTH = 64  # tokens per probe row (rows of real requests are mostly shorter)
# A CPU forward is formed to at most this many padded tokens per thread (the limits still
# apply). Measured on d3-edge with one thread at float32: a token costs least in forwards of
# about 250 to 550 padded tokens (243-247 us), 6-13 % more from 650 to 7000 (262-281 us), as
# activations outgrow the core's caches; bench/forward_sizes.py prints the curve of any machine.
CPU_FORWARD_TOKENS_PER_THREAD = 512
# Below float32 (bfloat16 / float16 weights and activations, half the bytes) the curve has no
# such rise before about 3500 tokens: on the AVX512-BF16 EPYC a 108-token row cost 154-173 us
# a token in forwards of 432 tokens and 150-160 us in forwards of 864-1728 (one thread, two
# runs), and `make bench-service` served 7 % more long rows at c=64 formed to 1024 (8.5 rows a
# forward instead of 4; docs/worker.md).
CPU_FORWARD_TOKENS_PER_THREAD_HALF = 1024


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
            + (costs.later(lo, sorted_len[lo - 1], limits) if lo > 0 else 0.0)
            + (costs.later(n - 1 - hi, longest, limits) if hi < n - 1 else 0.0)
        )

    # Grow one row at a time towards whichever side costs less, to the limits, and keep the
    # cheapest window seen: the total is not monotone along the way (a long row next in line
    # raises it; the rows after it, as long, bring it down again).
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
        # Ties join (rows of one length cost the same in one forward or later with no fixed
        # cost measured): fewer forwards.
        if current <= chosen[0] + 1e-9 * abs(chosen[0]):
            chosen = (current, lo, hi)
        elif costs.cost((hi - lo + 1) * width) > chosen[0]:
            break  # this forward alone now costs more than the best plan: growing cannot help
    _, lo, hi = chosen
    return sorted(order[lo : hi + 1])
