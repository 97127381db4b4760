"""The Kafka admin adapter: topic creation, offsets, consumer groups' committed offsets,
DeleteRecords, batched.

Calls block (they wait on the client's futures); async callers use `asyncio.to_thread`.
Every call takes explicit timeouts. Library errors are translated once, through the table in
`_errors.py`, into `KafkaUnavailable` (retryable), `KafkaRejected` (not retryable) and the
rest; a topic name Kafka refuses is the caller's error (`InvalidArgument`), never a temporary
one.

An answer Kafka cannot mean is an error too: a negative offset from ListOffsets (librdkafka
answers -1001, "invalid offset", with no error while a partition's leader is dead), a
DeleteRecords low watermark below 0, a partition missing from the answer or without a
leader. Each is a `KafkaUnavailable` that also rebuilds the client (fresh metadata, rate
limited); a read is asked once more on the fresh client before the error reaches the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.admin._metadata import ClusterMetadata
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from metasrv.errors import Conflict, InvalidArgument, KafkaUnavailable, MetasrvError
from metasrv.kafka._client_config import ClientConfig, client_config
from metasrv.kafka._errors import (
    NOT_FOUND_CODES,
    STALE_METADATA_CODES,
    CredentialErrors,
    translate_kafka_error,
)
from metasrv.kafka._topics import collision_key, leader_problem
from metasrv.model import PartitionOffsets, TopicDurability
from metasrv.settings import WalSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

_MIN_REBUILD_INTERVAL = 5.0
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # all zeros: a broker keeping no ids (Kafka < 2.8)
_ID_RETRY_DELAY = 0.2
"""Seconds between two DescribeTopics of one topic whose id `topic_id` waits for."""
_DESCRIBE_WAIT = 2.0
"""Seconds an offsets read waits for DescribeTopics' topic ids (answered in milliseconds by
a live broker)."""
_READ_TIMEOUT = 5.0
"""Default seconds an offsets read waits: ListOffsets is answered in milliseconds by a live
leader, and one sent to a dead leader spins librdkafka until it expires (`_conf`)."""


class KafkaAdmin:
    """One admin client for the configured brokers.

    `security` holds librdkafka's TLS/SASL properties (`client_config`); `from_settings`
    builds both from `[wal]`.
    """

    def __init__(
        self,
        bootstrap: str | list[str],
        *,
        request_timeout: float = 10.0,
        delete_records_wait: float = 2.0,
        security: ClientConfig | None = None,
    ) -> None:
        servers = bootstrap if isinstance(bootstrap, str) else ",".join(bootstrap)
        self.bootstrap = servers
        self.request_timeout = request_timeout
        self.delete_records_wait = min(delete_records_wait, request_timeout)
        self._credential_errors = CredentialErrors()
        # CPU while a broker is down: an admin request whose target broker is down waits in
        # librdkafka's admin worker (rdkafka_admin.c, rd_kafka_admin_common_get_broker), which
        # re-registers for "any broker state change" and asks for a connection again each
        # time; a refused connect is itself a state change, so the main thread and the dead
        # broker's thread feed each other with no reconnect backoff (0.76 core measured with
        # reconnect.backoff.ms 100 and 1000 alike, benchmarks/kafka_broker_down_cpu.py).
        # It lasts as long as requests target the dead broker: until the request times out
        # and, because librdkafka's ListOffsets answers -1001 and never refreshes the leader,
        # until its 5-minute topic metadata refresh. So no request is left pointing at a dead
        # leader: a negative offset, a stale-metadata error or a timeout rebuilds the client
        # (fresh metadata), and every request carries the caller's deadline as its timeout.
        self._conf: dict[str, Any] = {
            "bootstrap.servers": servers,
            "socket.timeout.ms": int(request_timeout * 1000),
            # Fail fast instead of librdkafka's default endless reconnect backoff logging.
            "reconnect.backoff.max.ms": 2000,
            "log_level": 3,
            **(security or {}),
            "error_cb": self._credential_errors,
        }
        self._client = AdminClient(self._conf)
        # Replaced clients stay referenced while calls started on them may still finish.
        self._retired: list[AdminClient] = []
        self._rebuilt_at = 0.0

    @classmethod
    def from_settings(cls, wal: WalSettings, *, request_timeout: float = 10.0) -> KafkaAdmin:
        """An admin client of `wal.broker_endpoints` with `[wal.tls]` / `[wal.sasl]`."""
        return cls(
            wal.broker_endpoints,
            request_timeout=request_timeout,
            delete_records_wait=wal.delete_records_wait,
            security=client_config(wal),
        )

    def _unavailable(self, what: str, exc: BaseException) -> MetasrvError:
        """A request that failed without a verdict: blame the credentials if the broker did."""
        self._client.poll(0)  # serves error_cb
        err = self._credential_errors.take(within=self.request_timeout + 5)
        if err is not None:
            return translate_kafka_error(KafkaException(err), what)
        return translate_kafka_error(exc, what)

    def _refresh_if_stale(self, exc: KafkaException) -> None:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() in STALE_METADATA_CODES:
            self._rebuild(err.name())

    def _rebuild(self, why: str) -> None:
        """Replace the client, so the next request starts from fresh metadata (at most once
        per `_MIN_REBUILD_INTERVAL`)."""
        now = time.monotonic()
        if now - self._rebuilt_at < _MIN_REBUILD_INTERVAL:
            return
        self._rebuilt_at = now
        logger.warning("kafka metadata stale (%s); rebuilding the admin client", why)
        self._retired = [*self._retired[-3:], self._client]
        self._client = AdminClient(self._conf)

    def _no_answer(self, what: str, why: str) -> KafkaUnavailable:
        """An answer Kafka cannot mean: refresh the metadata and report it as retryable."""
        self._rebuild(why)
        return KafkaUnavailable(f"{what}: {why}", details={"kafka_error": "no_usable_answer"})

    def _wait(self, futures: Mapping[Any, Future[T]], what: str) -> dict[Any, T]:
        results: dict[Any, T] = {}
        for key, future in futures.items():
            try:
                results[key] = future.result(timeout=self.request_timeout + 5)
            except KafkaException as exc:
                self._refresh_if_stale(exc)
                raise self._unavailable(f"{what} {key}", exc) from exc
            except TimeoutError as exc:
                self._rebuild("timed out")
                raise self._unavailable(f"{what} {key}", KafkaUnavailable("timed out")) from exc
        return results

    def ping(self, topics: Iterable[str] = (), *, timeout: float | None = None) -> int:
        """Readiness: metadata answers, every partition of `topics` that exists has a live
        leader, and partition 0's offsets of those topics can be read, all within `timeout`
        (default: the request timeout). Returns the broker count; raises `KafkaUnavailable`
        naming the first topic that fails.

        A leader named in metadata may be dead for the seconds before Kafka fences it, so
        only reading the offsets proves them readable.
        """
        deadline = time.monotonic() + (self.request_timeout if timeout is None else timeout)
        md = self._metadata(max(0.1, deadline - time.monotonic()))
        names = sorted({t for t in topics if t in md.topics})
        for topic in names:
            problem = leader_problem(md, topic)
            if problem is not None:
                raise self._no_answer(f"metadata of {topic}", problem)
        if names:
            self.offsets(names, timeout=max(0.1, deadline - time.monotonic()))
        return len(md.brokers)

    def _metadata(self, timeout: float) -> ClusterMetadata:
        try:
            return self._client.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise self._unavailable("metadata request", exc) from exc

    def list_topics(self) -> set[str]:
        """Names of every topic in the cluster."""
        return set(self._metadata(self.request_timeout).topics)

    def ensure_topics(
        self,
        topics: Iterable[str],
        *,
        replication_factor: int = 1,
        num_partitions: int = 1,
        config: Mapping[str, str] | None = None,
        create_timeout: float | None = None,
    ) -> list[str]:
        """Create the missing ones with `config` (default: delete policy, no time retention).

        Returns the topics this call created. Already-existing topics are fine (and keep
        their own settings).
        """
        wanted = sorted(set(topics))
        if not wanted:
            return []
        existing = self.list_topics()
        missing = [t for t in wanted if t not in existing]
        if not missing:
            return []
        by_collision_key = {collision_key(t): t for t in existing}
        for topic in missing:
            other = by_collision_key.get(collision_key(topic))
            if other is not None:
                raise Conflict(
                    f"topic {topic!r} collides with existing topic {other!r}: "
                    "Kafka treats '.' and '_' in topic names as the same",
                    details={"topic": topic, "existing_topic": other},
                )
        topic_config = dict(config or {"cleanup.policy": "delete", "retention.ms": "-1"})
        new = [
            NewTopic(
                t,
                num_partitions=num_partitions,
                replication_factor=replication_factor,
                config=topic_config,
            )
            for t in missing
        ]
        timeout = self.request_timeout if create_timeout is None else create_timeout
        futures = self._client.create_topics(
            new, request_timeout=timeout, operation_timeout=timeout
        )
        created: list[str] = []
        for topic, future in futures.items():
            try:
                future.result(timeout=timeout + 5)
                created.append(topic)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise translate_kafka_error(exc, f"create topic {topic}") from exc
            except TimeoutError as exc:
                timed_out = KafkaUnavailable("timed out")
                raise self._unavailable(f"create topic {topic}", timed_out) from exc
        logger.info("created kafka topics", extra={"topics": created})
        return created

    def topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """Each topic's effective Kafka settings (DescribeConfigs), name -> value."""
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in sorted(set(topics))]
        if not resources:
            return {}
        futures = self._client.describe_configs(resources, request_timeout=self.request_timeout)
        results = self._wait(futures, "describe_configs")
        return {
            res.name: {name: entry.value for name, entry in entries.items()}
            for res, entries in results.items()
        }

    def durability(
        self, topics: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, TopicDurability]:
        """Replication factor (metadata) and effective `min.insync.replicas`
        (DescribeConfigs) of each of `topics` that exists in Kafka."""
        wait = self.request_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        md = self._metadata(wait)
        replicas: dict[str, int] = {}
        for topic in sorted(set(topics)):
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                continue
            first = meta.partitions.get(0) or next(iter(meta.partitions.values()))
            replicas[topic] = len(first.replicas)
        if not replicas:
            return {}
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in replicas]
        remaining = max(0.1, deadline - time.monotonic())
        try:
            futures = self._client.describe_configs(resources, request_timeout=remaining)
        except KafkaException as exc:
            raise translate_kafka_error(exc, "describe_configs") from exc
        min_isr: dict[str, int | None] = {}
        for res, future in futures.items():
            try:
                entries = future.result(timeout=max(0.0, deadline - time.monotonic()) + 1)
            except (KafkaException, TimeoutError) as exc:
                logger.warning("describe_configs %s failed: %s", res.name, exc)
                continue
            entry = entries.get("min.insync.replicas")
            value = None if entry is None else entry.value
            min_isr[res.name] = int(value) if value is not None and value.isdigit() else None
        return {
            t: TopicDurability(replication_factor=rf, min_insync_replicas=min_isr.get(t))
            for t, rf in replicas.items()
        }

    def topic_id(self, topic: str, *, timeout: float | None = None) -> str:
        """Kafka's id of `topic` (DescribeTopics), asked again until `timeout` seconds
        (default: the request timeout) have passed: a topic created a moment ago may not be
        known to the broker asked yet. `KafkaUnavailable` when no id came."""
        deadline = time.monotonic() + (self.request_timeout if timeout is None else timeout)
        why = "no answer"
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                futures = self._client.describe_topics(
                    TopicCollection([topic]), request_timeout=left
                )
                found = str(futures[topic].result(timeout=left).topic_id)
            except (KafkaException, TimeoutError) as exc:
                why = str(exc) or type(exc).__name__
                if isinstance(exc, KafkaException):
                    self._refresh_if_stale(exc)
            else:
                if found != _NO_TOPIC_ID:
                    return found
                why = "the broker keeps no topic ids"
            if time.monotonic() + _ID_RETRY_DELAY >= deadline:
                raise KafkaUnavailable(f"describe_topics {topic}: {why}", details={"topic": topic})
            time.sleep(_ID_RETRY_DELAY)

    def offsets(
        self, topics: Iterable[str], *, timeout: float | None = None, topic_ids: bool = True
    ) -> dict[str, PartitionOffsets]:
        """Log start and high watermark of partition 0 of each topic, with its topic id
        unless `topic_ids` is false (`offsets_each`); raises the first topic's error."""
        answers = self.offsets_each(topics, timeout=timeout, topic_ids=topic_ids)
        found: dict[str, PartitionOffsets] = {}
        for topic, answer in answers.items():
            if isinstance(answer, MetasrvError):
                raise answer
            found[topic] = answer
        return found

    def offsets_each(
        self, topics: Iterable[str], *, timeout: float | None = None, topic_ids: bool = True
    ) -> dict[str, PartitionOffsets | MetasrvError]:
        """Each topic's partition-0 offsets and Kafka topic id, or the error that stopped
        them, from one batched request per offset kind and one batched DescribeTopics, all
        in flight at once and answered within `timeout` seconds (default: `_READ_TIMEOUT`,
        at most the request timeout; the id is never cached: a recreated topic has a new
        one). A topic whose answer made the client rebuild (stale metadata, a negative
        offset, a timeout) is asked once more on the fresh client. `topic_ids=False` skips
        DescribeTopics (a reader that never plans a purge, such as a sampler)."""
        names = sorted(set(topics))
        if not names:
            return {}
        wait = min(_READ_TIMEOUT, self.request_timeout) if timeout is None else timeout
        deadline = time.monotonic() + wait
        client = self._client
        answers = self._offsets_once(names, deadline, topic_ids)
        again = [t for t, a in answers.items() if isinstance(a, MetasrvError)]
        if again and self._client is not client and time.monotonic() < deadline:
            # Fresh metadata (a topic created a moment ago, a new partition leader): a read
            # is safe to ask again, once.
            answers.update(self._offsets_once(again, deadline, topic_ids))
        return answers

    def _offsets_once(
        self, topics: list[str], deadline: float, topic_ids: bool
    ) -> dict[str, PartitionOffsets | MetasrvError]:
        # OffsetSpec's factories carry no annotations in confluent-kafka's own stubs.
        specs = {
            "log start": OffsetSpec.earliest(),  # type: ignore[no-untyped-call]
            "high watermark": OffsetSpec.latest(),  # type: ignore[no-untyped-call]
        }
        # Both requests are in flight at once; each future is waited for until `deadline`.
        pending: dict[str, dict[str, Future[Any]]] = {}
        for kind, spec in specs.items():
            request = {TopicPartition(t, 0): spec for t in topics}
            timeout = max(0.1, deadline - time.monotonic())
            try:
                futures = self._client.list_offsets(request, request_timeout=timeout)
            except KafkaException as exc:
                failed = translate_kafka_error(exc, "list_offsets")
                return dict.fromkeys(topics, failed)
            pending[kind] = {tp.topic: f for tp, f in futures.items() if tp.partition == 0}
        # A topic recreated between these answers pairs old offsets with the new id (a reset
        # by its id) or new offsets with the old id (by the high watermark below the marker).
        # DescribeTopics goes to the broker librdkafka takes for the controller, not to the
        # partition leader: one paused broker must not stall the offsets a purge needs, so
        # its answer is waited for `_DESCRIBE_WAIT` at most and a topic without one gets no
        # id (the plan then names no prune point for a topic whose marker records an id).
        described_by = min(deadline, time.monotonic() + _DESCRIBE_WAIT)
        described: Mapping[str, Future[Any]] = {}
        if topic_ids:
            try:
                described = self._client.describe_topics(
                    TopicCollection(topics),
                    request_timeout=max(0.1, described_by - time.monotonic()),
                )
            except KafkaException as exc:
                self._rebuild(f"describe_topics failed: {exc}")
        answers: dict[str, PartitionOffsets | MetasrvError] = {}
        for topic in topics:
            try:
                low, high = (self._offset(pending[kind], topic, kind, deadline) for kind in specs)
            except MetasrvError as exc:
                answers[topic] = exc
            else:
                answers[topic] = PartitionOffsets(
                    low, high, self._topic_id(described, topic, described_by)
                )
        return answers

    def _topic_id(
        self, futures: Mapping[str, Future[Any]], topic: str, deadline: float
    ) -> str | None:
        """Kafka's id of `topic` (base64, as `kafka-topics.sh --describe` prints it); None
        when Kafka did not say by `deadline`."""
        future = futures.get(topic)
        if future is None:
            return None
        try:
            topic_id = str(future.result(timeout=max(0.0, deadline - time.monotonic())).topic_id)
        except (KafkaException, TimeoutError) as exc:
            # librdkafka keeps asking the broker it took for the controller; fresh metadata
            # names another once Kafka has fenced a paused or dead one.
            self._rebuild(f"no topic id for {topic}: {exc}")
            return None
        return None if topic_id == _NO_TOPIC_ID else topic_id

    def _offset(
        self, futures: Mapping[str, Future[Any]], topic: str, kind: str, deadline: float
    ) -> int:
        what = f"list_offsets {topic} ({kind})"
        offset = int(self._result(futures, topic, what, deadline).offset)
        if offset < 0:
            # librdkafka answers -1001 (OFFSET_INVALID) with no error while the partition's
            # leader is dead, until its metadata is refreshed (minutes): never an offset.
            raise self._no_answer(what, f"Kafka answered offset {offset} (leader unavailable?)")
        return offset

    def _result(
        self, futures: Mapping[str, Future[Any]], topic: str, what: str, deadline: float
    ) -> Any:
        """`topic`'s answer in `futures` by `deadline`; missing, failed or late: an error."""
        future = futures.get(topic)
        if future is None:
            raise self._no_answer(what, "partition 0 missing from Kafka's answer")
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except KafkaException as exc:
            self._refresh_if_stale(exc)
            raise self._unavailable(what, exc) from exc
        except TimeoutError as exc:
            self._rebuild("timed out")
            raise self._unavailable(what, KafkaUnavailable("timed out")) from exc

    def committed_offsets(
        self, groups: Iterable[str], topics: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, dict[str, int | None] | MetasrvError]:
        """Each topic's committed offset of every one of `groups` on partition 0 (None: the
        group has none there), or the error that stopped them: one OffsetFetch request per
        group covering every topic (librdkafka takes one group a request), all in flight at
        once and answered within `timeout` seconds (default as `offsets_each`). A group that
        cannot be read fails every topic (each needs all its groups); a partition's own
        error fails that topic. Errors are the table's (`KafkaUnavailable` when retryable).
        """
        names = sorted(set(topics))
        wanted = sorted(set(groups))
        if not names or not wanted:
            return {t: {} for t in names}
        wait = min(_READ_TIMEOUT, self.request_timeout) if timeout is None else timeout
        deadline = time.monotonic() + wait
        pending: dict[str, Future[Any] | MetasrvError] = {}
        for group in wanted:
            request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, 0) for t in names])
            try:
                futures = self._client.list_consumer_group_offsets(
                    [request], request_timeout=max(0.1, deadline - time.monotonic())
                )
            except KafkaException as exc:
                pending[group] = translate_kafka_error(exc, f"list_consumer_group_offsets {group}")
                continue
            pending[group] = futures[group]
        found: dict[str, dict[str, int | None]] = {t: {} for t in names}
        failed: dict[str, MetasrvError] = {}
        for group in wanted:
            what = f"committed offsets of consumer group {group}"
            answer = pending[group]
            try:
                if isinstance(answer, MetasrvError):
                    raise answer
                result = self._result({group: answer}, group, what, deadline)
            except MetasrvError as exc:
                for topic in names:
                    failed.setdefault(topic, exc)
                continue
            by_topic = {tp.topic: tp for tp in result.topic_partitions or () if tp.partition == 0}
            for topic in names:
                tp = by_topic.get(topic)
                if tp is None:
                    failed.setdefault(topic, self._no_answer(what, f"{topic} missing"))
                elif tp.error is not None:
                    error = translate_kafka_error(KafkaException(tp.error), f"{what} on {topic}")
                    failed.setdefault(topic, error)
                else:
                    # librdkafka answers -1001 (OFFSET_INVALID) where the group committed none.
                    found[topic][group] = int(tp.offset) if tp.offset >= 0 else None
        return {t: failed[t] if t in failed else found[t] for t in names}

    def delete_records(self, targets: Mapping[str, int]) -> dict[str, int]:
        """DeleteRecords(topic, partition 0, offset) for each topic, one batched request.

        Returns each topic's low watermark after the deletion. Idempotent for the same or
        a lower offset (Kafka keeps the higher log start). The broker waits at most
        `delete_records_wait` for the followers, then answers REQUEST_TIMED_OUT (a
        `KafkaUnavailable`) with its own log start already moved: callers read the log
        start to learn what happened.
        """
        if not targets:
            return {}
        negative = {t: off for t, off in targets.items() if off < 0}
        if negative:
            # Kafka reads offset -1 as "delete everything up to the high watermark".
            raise InvalidArgument(f"refusing DeleteRecords at negative offsets: {negative}")
        partitions = [TopicPartition(t, 0, off) for t, off in sorted(targets.items())]
        try:
            futures = self._client.delete_records(
                partitions,
                request_timeout=self.request_timeout,
                operation_timeout=self.delete_records_wait,
            )
        except KafkaException as exc:
            raise translate_kafka_error(exc, "delete_records") from exc
        results = self._wait(futures, "delete_records")
        lows = {tp.topic: int(res.low_watermark) for tp, res in results.items()}
        for topic in targets:
            low = lows.get(topic)
            if low is None or low < 0:
                said = "no answer" if low is None else f"low watermark {low}"
                raise self._no_answer(f"delete_records {topic}", f"Kafka gave {said}")
        return lows

    def delete_topics(self, topics: Iterable[str]) -> None:
        """Delete topics (tests and `stack` clean-up only)."""
        names = sorted(set(topics))
        if not names:
            return
        futures = self._client.delete_topics(names, request_timeout=self.request_timeout)
        for topic, future in futures.items():
            try:
                future.result(timeout=self.request_timeout + 5)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() in NOT_FOUND_CODES:
                    continue
                raise translate_kafka_error(exc, f"delete topic {topic}") from exc

    def close(self) -> None:
        """AdminClient has no close; drop the reference so librdkafka can tear down."""
        self._client = None  # type: ignore[assignment]
