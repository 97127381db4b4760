"""Deleting a topic's WAL below a target in Kafka, with the partition leader's log start as
the truth of what was deleted (`delete_below`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from metasrv.errors import KafkaUnavailable, MetasrvError
from procedures.wal_purge._batcher import KafkaBatcher

logger = logging.getLogger(__name__)


async def delete_below(
    batcher: KafkaBatcher, topic: str, target: int, log_start: int, *, extra: Mapping[str, Any]
) -> int:
    """DeleteRecords below `target` unless Kafka's log start is already there; returns
    the partition leader's log start, which is at or past `target`. `extra` goes with
    every log line.

    DeleteRecords' answer is not the truth: on a timeout the leader may have deleted
    already (it moves its log start before waiting for the replicas), and the answer's
    low watermark is the lowest over live replicas, which a lagging follower holds
    back. The partition leader's log start (ListOffsets) is what a replaying region
    meets, so that is what decides.
    """
    if log_start >= target:
        return log_start
    try:
        low = await batcher.delete_records(topic, target)
    except MetasrvError as exc:
        low = (await batcher.offsets(topic)).log_start_offset
        if low < target:
            raise
        logger.warning(
            "DeleteRecords failed but Kafka's log start is past the target",
            extra={**extra, "error": str(exc), "log_start": low},
        )
    if low < target:
        low = (await batcher.offsets(topic)).log_start_offset
    if low < target:
        raise KafkaUnavailable(
            f"topic {topic}: Kafka's log start {low} below {target} after DeleteRecords"
        )
    logger.info("deleted WAL records", extra={**extra, "offset": target, "low_watermark": low})
    return low
