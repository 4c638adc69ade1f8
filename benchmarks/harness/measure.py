"""The figures both speed benchmarks report, computed one way.

Decode throughput: output tokens after each request's first token, over the
time during which at least one request was past its first token (the union of
the requests' [first token, last token] intervals). For one request that is
``(n - 1) / (last - first)``; for a batch or a serving run it leaves out the
time when every request waited for its prefill.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence


def spread(values: Sequence[float]) -> dict:
    """{"min", "median", "max", "n"} of the runs' figures."""
    values = list(values)
    if not values:
        return {"min": None, "median": None, "max": None, "n": 0}
    return {"min": min(values), "median": statistics.median(values),
            "max": max(values), "n": len(values)}


def covered_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def decode_throughput(requests: Iterable[tuple[float, float, int]]) -> dict:
    """From (first token time, last token time, output tokens) per request:
    {"decode_s", "decode_tokens", "decode_tok_s"} (tok/s None without time)."""
    requests = list(requests)
    seconds = covered_seconds((first, last) for first, last, _ in requests)
    tokens = sum(max(0, n - 1) for _, _, n in requests)
    return {"decode_s": seconds, "decode_tokens": tokens,
            "decode_tok_s": tokens / seconds if seconds > 0 else None}


def burst_shape(requests: Iterable[tuple[float, float, int]]) -> dict:
    """Where a serving run's decode window goes, from (first token time, last
    token time, output tokens) per request: ``first_token_spread_s``, from the
    first request's first token to the last one's (prompts still being
    prefilled: the target's prefill, the same work in every mode, and any
    draft pass over the prompts), and ``last_request_decode_s``, the decode
    time of the request whose first token came last (the first of them in
    the list on a tie). For one burst (a request per slot) whose last first
    token's request also ends last, the decode window (``decode_throughput``)
    is their sum, so the decode-phase gain of a faster decode is bounded by
    the spread; with more requests than slots the spread also holds the
    first wave's decoding."""
    requests = list(requests)
    if not requests:
        return {"first_token_spread_s": None, "last_request_decode_s": None}
    firsts = [first for first, _, _ in requests]
    first, last, _ = max(requests, key=lambda r: r[0])
    return {"first_token_spread_s": first - min(firsts),
            "last_request_decode_s": last - first}


def mean_in_flight(spans: Iterable[tuple[float, float]]) -> float | None:
    """Mean number of requests in flight, from (start, end) per request: the
    sum of the requests' durations over the wall time from the first start to
    the last end (the time average of the count of open requests; None
    without time)."""
    spans = list(spans)
    if not spans:
        return None
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return sum(end - start for start, end in spans) / wall if wall > 0 else None


# A run whose later requests waited this many times longer for their first
# token than its earlier ones ran past the server's capacity: its queue grew
# all run long. H200, 8B, 32K/512 (2026-11-28): 0.9-1.1 at 0.35 and 0.5
# req/s, 2.7-4.8 at 1.14 and 1.63 (plain completes 0.53).
QUEUE_GROWTH = 2.0


def ttft_growth(starts: Sequence[float], ttfts: Sequence[float]) -> float | None:
    """Median time to first token of the last third of a run's requests (by
    start) over that of its first third; None under 3 requests. About 1 where
    the server keeps up (a finite run's mean in flight does not tell: it
    grows with the rate past the capacity too), above ``QUEUE_GROWTH`` where
    the queue grew."""
    ordered = [t for _, t in sorted(zip(starts, ttfts, strict=True))]
    third = len(ordered) // 3
    if not third:
        return None
    first = statistics.median(ordered[:third])
    return statistics.median(ordered[-third:]) / first if first > 0 else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between ranks (numpy's default)."""
    values = sorted(values)
    if not values:
        return None
    rank = (len(values) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)
