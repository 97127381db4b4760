"""The reconcile rules that do not depend on the engine: parameters, coverage, topic checks.

Region-level rules (stale, mismatch, unmapped, retention overrun) run over millions of
rows and live in the Spark job (`_job.py`); their definitions are written out here, next
to their parameters, so every engine implements the same thing:

- `stale_region`: a (region, mapped topic) pair whose region's latest stat was received
  before `now - stale_after`, or that has no stat at all in the history window while the
  history reaches back past `now - stale_after`. Only judged while the history is being
  recorded (a snapshot exists after `now - stale_after`); otherwise skipped with a note.
- `topic_mismatch`: a mapped pair whose region's latest stat (any age, in the window)
  reports another topic. Critical: the purge of the mapped topic ignores where it writes.
- `unmapped_region`: a region with a stat received at or after `now - stale_after` that is
  in no mapping. Critical, and WAL data loss, when registering it would hide entries it
  needs (`registration_hides`): its latest stat's prunable entry id is below the reported
  topic's marker (purges ran without it: the planner's `max(prunable, marker)` and
  replay-start would skip its entries from `prunable + 1` to the marker), or below
  Kafka's log start - 1 (they are gone), or unknown.
- `retention_overrun`: a mapped pair on an existing topic whose known prunable entry id
  (the greater of its latest stat's, when that stat reports this topic, and its kv
  checkpoint) is known and `log_start_offset > prunable + 1`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from metasrv.model import PartitionOffsets
from metasrv.reconcile._findings import Finding
from metasrv.wire import FindingKind, Severity

SKEW_EVIDENCE_TOPICS = 100
"""Most topics listed in a skew finding's proposed assignment."""


@dataclass(frozen=True, slots=True)
class ReconcileParams:
    """Thresholds and the instant a run judges against."""

    now: float
    """Wall-clock epoch seconds the run treats as "now"."""
    stale_after: float
    """Seconds without a stat after which a mapped region is stale."""
    history_window: float
    """Seconds of stat history read (at least `stale_after`)."""
    skew_tolerance: float = 0.25
    """Allowed spread of regions per pool topic, as a fraction of the mean."""

    @property
    def now_ms(self) -> int:
        """`now` in epoch milliseconds."""
        return int(self.now * 1000)

    @property
    def stale_cutoff_ms(self) -> int:
        """Stats received before this (epoch ms) are stale."""
        return self.now_ms - int(self.stale_after * 1000)

    @property
    def window_start(self) -> float:
        """Oldest stat time read (epoch s)."""
        return self.now - max(self.history_window, self.stale_after)


@dataclass(frozen=True, slots=True)
class Coverage:
    """Which span of time the stat history covers in the window read."""

    start_ms: int | None
    """Time of the oldest snapshot (epoch ms), None when there is none."""
    end_ms: int | None
    """Time of the newest snapshot (epoch ms)."""
    snapshots: int
    """Snapshots in the window."""

    def stale_check(self, params: ReconcileParams) -> tuple[bool, bool, str | None]:
        """(judge staleness at all, judge never-seen regions, note explaining a skip)."""
        cutoff = params.stale_cutoff_ms
        if self.end_ms is None or self.end_ms < cutoff:
            return (
                False,
                False,
                "stale_region check skipped: the stat history has no snapshot in the last "
                f"{params.stale_after:g}s (is the leader recording it?)",
            )
        if self.start_ms is None or self.start_ms > cutoff:
            return (
                True,
                False,
                "regions never seen in the stat history are not judged stale: the history "
                f"covers less than {params.stale_after:g}s",
            )
        return True, True, None


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """What the region-level pass learned about one mapped topic."""

    regions: int
    """(region, topic) mappings on the topic."""
    max_progress: int | None
    """Highest known prunable entry id of a region mapped to it (None when none known)."""


def registration_hides(
    prunable_entry_id: int | None, marker: int | None, log_start_offset: int | None
) -> str | None:
    """Why registering an unmapped region on its reported topic would hide entries it
    needs, or None when it would not: it needs entries from `prunable_entry_id + 1` on,
    and once it is mapped the planner and replay-start treat it as needing nothing at or
    below the topic's `marker` (`max(prunable, marker)`), while Kafka holds nothing
    below `log_start_offset`. Both are WAL data loss to report, not to register over."""
    if prunable_entry_id is None:
        return "its prunable entry id is unknown, so what it needs cannot be checked"
    needs = prunable_entry_id + 1
    if marker is not None and prunable_entry_id < marker:
        return (
            f"it needs entries from {needs}, at or below the topic's marker {marker} "
            "(purged without it)"
        )
    if log_start_offset is not None and log_start_offset > needs:
        return f"it needs entries from {needs}, below Kafka's log start {log_start_offset}"
    return None


def pool_topics(prefix: str, num_topics: int) -> list[str]:
    """The configured topic pool `{prefix}_{n}`, n in [0, num_topics)."""
    return [f"{prefix}_{n}" for n in range(num_topics)]


def topic_findings(
    *,
    facts: Mapping[str, TopicFacts],
    markers: Mapping[str, int | None],
    kafka_topics: Collection[str],
    offsets: Mapping[str, PartitionOffsets],
    pool: Sequence[str],
    prefix: str,
    skew_tolerance: float,
) -> list[Finding]:
    """`missing_topic`, `orphan_topic` and `skew` findings (small inputs: one row per topic)."""
    found: list[Finding] = []
    pool_set = set(pool)
    existing = set(kafka_topics)
    known = pool_set | {t for t, f in facts.items() if f.regions > 0} | set(markers)
    for topic in sorted(known - existing):
        fact = facts.get(topic, TopicFacts(0, None))
        pruned = markers.get(topic)
        has_data = pruned is not None or (fact.max_progress is not None and fact.max_progress >= 0)
        found.append(
            Finding(
                FindingKind.MISSING_TOPIC,
                Severity.CRITICAL if fact.regions else Severity.WARNING,
                topic,
                None,
                f"topic {topic} does not exist in Kafka"
                + (f" but {fact.regions} region(s) are mapped to it" if fact.regions else ""),
                {
                    "in_pool": topic in pool_set,
                    "regions": fact.regions,
                    "has_marker": topic in markers,
                    "pruned_entry_id": pruned,
                    "max_progress": fact.max_progress,
                    # Recreating a topic that held entries would hide WAL data loss.
                    "held_data": has_data,
                },
            )
        )
    pool_prefix = f"{prefix}_"
    for topic in sorted(existing):
        if not topic.startswith(pool_prefix) or topic in pool_set:
            continue
        if facts.get(topic, TopicFacts(0, None)).regions:
            continue
        off = offsets.get(topic)
        found.append(
            Finding(
                FindingKind.ORPHAN_TOPIC,
                Severity.INFO,
                topic,
                None,
                f"Kafka topic {topic} has the pool prefix, is outside the pool and has no region",
                {
                    "has_marker": topic in markers,
                    "log_start_offset": None if off is None else off.log_start_offset,
                    "high_watermark": None if off is None else off.high_watermark,
                },
            )
        )
    skew = skew_finding(
        {t: facts.get(t, TopicFacts(0, None)).regions for t in pool}, skew_tolerance, prefix
    )
    if skew is not None:
        found.append(skew)
    return found


def skew_finding(counts: Mapping[str, int], tolerance: float, prefix: str) -> Finding | None:
    """A `skew` finding when pool topics' region counts spread beyond the tolerance.

    Skewed when `max - min > max(1, tolerance * mean)`. The proposed assignment says how
    many of the next new regions each under-loaded topic should get (least loaded first)
    to bring every topic up to the most loaded one's count.
    """
    if len(counts) < 2:
        return None
    values = list(counts.values())
    lo, hi = min(values), max(values)
    mean = sum(values) / len(values)
    allowed = max(1.0, tolerance * mean)
    if hi - lo <= allowed:
        return None
    order = sorted(counts.items(), key=lambda kv: (kv[1], _pool_index(kv[0])))
    proposed = {t: hi - n for t, n in order if hi - n > 0}
    listed = dict(list(proposed.items())[:SKEW_EVIDENCE_TOPICS])
    most = sorted(counts.items(), key=lambda kv: (-kv[1], _pool_index(kv[0])))[:5]
    return Finding(
        FindingKind.SKEW,
        Severity.WARNING,
        None,
        None,
        f"regions per pool topic range from {lo} to {hi} (mean {mean:.1f}, "
        f"allowed spread {allowed:.1f})",
        {
            "pool_prefix": prefix,
            "pool_size": len(counts),
            "regions": sum(values),
            "min": lo,
            "max": hi,
            "mean": round(mean, 3),
            "tolerance": tolerance,
            "most_loaded": [[t, n] for t, n in most],
            "least_loaded": [[t, n] for t, n in order[:5]],
            "new_regions_to_balance": sum(proposed.values()),
            "proposed_assignment": listed,
            "proposed_assignment_truncated": len(listed) < len(proposed),
        },
    )


def _pool_index(topic: str) -> tuple[int, str]:
    """Sort key putting `{prefix}_2` before `{prefix}_10`."""
    tail = topic.rpartition("_")[2]
    return (int(tail), "") if tail.isdigit() else (-1, topic)
