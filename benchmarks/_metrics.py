"""A daemon's `/metrics` as the benchmarks read them: every family's total, one
histogram's buckets, and the leader's event-loop lag over a measured window."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx

LOOP_LAG = "metasrv_event_loop_lag_seconds"


def scrape(url: str) -> dict[str, float]:
    """Sum of each metric family's samples on `/metrics` (labels folded)."""
    out: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            out[name] = out.get(name, 0.0) + float(value)
    return out


def scrape_buckets(url: str, family: str = LOOP_LAG) -> dict[float, float]:
    """Cumulative bucket counts of one histogram on `/metrics`: {upper bound: count}."""
    out: dict[float, float] = {}
    prefix = f'{family}_bucket{{le="'
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(prefix):
            le, _, value = line[len(prefix) :].partition('"} ')
            out[float(le)] = float(value)
    return out


def loop_lag_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """What the leader's event-loop lag histogram says about the measured window: the share
    of probes at or under each bound, and the smallest bucket bound holding p99 / every probe."""
    counts = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    if total <= 0:
        return {"probes": 0}

    def bound(share: float) -> float | None:
        le = next((le for le, n in counts.items() if n >= share * total), None)
        return None if le is None or le == float("inf") else le * 1000

    return {
        "probes": int(total),
        "share_le_10ms": round(counts.get(0.01, 0.0) / total, 5),
        "share_le_20ms": round(counts.get(0.02, 0.0) / total, 5),
        "share_le_50ms": round(counts.get(0.05, 0.0) / total, 5),
        "p99_at_most_ms": bound(0.99),
        "max_at_most_ms": bound(1.0),
    }
