"""Each WAL topic's effective replication factor and `min.insync.replicas`, cached.

DescribeConfigs is a request per broker round; nothing on the heartbeat or purge paths
asks for durability. Readers (`GET /v1/topics`, the start-up check) take the cached view,
refreshed when it is older than `max_age` seconds or when asked to.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence

from metasrv.errors import MetasrvError
from metasrv.kafka._admin import KafkaAdmin
from metasrv.model import TopicDurability

logger = logging.getLogger(__name__)

MAX_AGE = 60.0
"""Seconds a topic's durability is served from the cache before Kafka is asked again."""


class DurabilityCache:
    """Durability of topics, read through `KafkaAdmin.durability` at most every `max_age`
    seconds per topic (blocking: async callers use `asyncio.to_thread`)."""

    def __init__(self, admin: KafkaAdmin, *, max_age: float = MAX_AGE) -> None:
        self._admin = admin
        self._max_age = max_age
        self._lock = threading.Lock()
        # topic -> (monotonic time read, durability or None when Kafka has no such topic)
        self._known: dict[str, tuple[float, TopicDurability | None]] = {}

    def get(
        self, topics: Iterable[str], *, refresh: bool = False, timeout: float = 5.0
    ) -> dict[str, TopicDurability]:
        """Durability of each of `topics` Kafka has; the cached view unless it is older than
        `max_age` or `refresh` is set. Kafka trouble leaves stale or missing entries (logged),
        never an error: this is a report, not a decision."""
        names = sorted(set(topics))
        with self._lock:
            now = time.monotonic()
            stale = [
                t
                for t in names
                if refresh or t not in self._known or now - self._known[t][0] > self._max_age
            ]
            if stale:
                self._read(stale, timeout)
            return {
                t: found for t in names if (found := self._known.get(t, (0.0, None))[1]) is not None
            }

    def _read(self, topics: Sequence[str], timeout: float) -> None:
        try:
            found = self._admin.durability(topics, timeout=timeout)
        except MetasrvError as exc:
            logger.warning("could not read topic durability: %s", exc)
            return
        at = time.monotonic()
        for topic in topics:
            self._known[topic] = (at, found.get(topic))


def below_configured(
    durability: dict[str, TopicDurability],
    *,
    replication_factor: int,
    min_insync_replicas: int | None,
) -> dict[str, str]:
    """Topics whose replication factor or effective min ISR is below the configured one,
    each with what is short (for the start-up warning)."""
    short: dict[str, str] = {}
    for topic, d in sorted(durability.items()):
        problems = []
        if d.replication_factor < replication_factor:
            problems.append(f"replication factor {d.replication_factor} < {replication_factor}")
        isr = d.min_insync_replicas  # None: Kafka did not say, which is not "below"
        if min_insync_replicas is not None and isr is not None and isr < min_insync_replicas:
            problems.append(f"min.insync.replicas {isr} < {min_insync_replicas}")
        if problems:
            short[topic] = ", ".join(problems)
    return short
