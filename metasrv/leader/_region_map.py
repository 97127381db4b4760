"""The topic-region map: which region writes its WAL to which topic (DESIGN §1, §4).

The map lives in the kv backend under `__topic_region/{topic}/{region_id}`; the leader
holds a copy in memory (loaded on gaining leadership) and is the only writer. Reads
(`route`, `regions_of`) are dict lookups, so the heartbeat hot path can afford one per
region. Registration takes the topic's shared lock while it writes, so a purge (which
holds the exclusive lock) never plans from a map that misses a region being added
(invariant 4). Writes carry the election's fence, so a deposed leader cannot change
the map.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import msgspec

from metasrv import keys
from metasrv.errors import (
    Conflict,
    DamagedMarker,
    InvalidArgument,
    KvUnavailable,
    LeadershipLost,
    NotFound,
    TopicReset,
)
from metasrv.kafka import KafkaAdmin, topic_name_problem
from metasrv.kv import Compare, Delete, KeyValue, KvBackend, KvChange, Put
from metasrv.leader._locks import TopicLocks
from metasrv.leader._map_load import SCAN_PAGE, map_route, read_map, unmap_route
from metasrv.model import ID_MAX, RegionRoute
from metasrv.settings import Settings

logger = logging.getLogger(__name__)


def _no_fence() -> list[Compare]:
    return []


def _pruned(kv: KeyValue) -> int | None:
    """A stored marker's entry id; a damaged marker reads as never purged
    (`keys.marker_or_none`)."""
    marker = keys.marker_or_none(kv.key, kv.value)
    return None if marker is None else marker.pruned_entry_id


class _Written(msgspec.Struct, frozen=True, gc=False):
    """A checkpoint written since the map was loaded: node id and entry id (untracked by
    the garbage collector, so a dict of them is too)."""

    node_id: int
    entry_id: int


class TopicRegionMap:
    """The leader's copy of the topic-region map, and the only code that changes it."""

    def __init__(
        self,
        kv: KvBackend,
        kafka: KafkaAdmin,
        locks: TopicLocks,
        settings: Settings,
        *,
        fence: Callable[[], Sequence[Compare]] = _no_fence,
    ) -> None:
        self._kv = kv
        self._kafka = kafka
        self._locks = locks
        self._settings = settings
        self.fence = fence
        """Compares that hold only while this process leads (set from the election)."""
        wal = settings.wal
        self._pool = [f"{wal.topic_name_prefix}_{n}" for n in range(wal.num_topics)]
        self._pool_set = frozenset(self._pool)
        self._routes: dict[int, RegionRoute] = {}
        self._by_topic: dict[str, dict[int, RegionRoute]] = {}
        # Checkpoints written since the route was loaded or registered. Kept apart from
        # the routes so a flush replaces two ints, not a route object: the routes stay
        # the ones frozen out of the collector's reach when leadership began (see
        # `Runtime`), and this dict, holding only untracked values, is never walked by
        # a collection either (a million entries at the design load).
        self._checkpoints: dict[int, _Written] = {}
        self._created: set[str] = set()
        self._identified: set[str] = set()
        """Topics whose marker records a Kafka topic id (read or written this term)."""
        self._malformed: set[str] = set()
        self.revision = 0
        """The kv revision the map reflects (its load's, then the last change applied)."""
        self._reserved: Counter[str] = Counter()
        self._uncertain: dict[int, str] = {}
        """Region id -> topic of a registration whose kv write had an unknown outcome and
        has not been re-read since."""
        # Serializes map changes (registration, removal, checkpoint writes) with each
        # other; never held while waiting for a topic lock.
        self._mutate = asyncio.Lock()
        self.loaded = False
        """True once `load()` has read the map since the last `unload()`."""
        self.removal_listeners: list[Callable[[RegionRoute], None]] = []
        """Called (synchronously, right after the map changed) with each removed route,
        or one whose region moved to another datanode; the registry and the checkpointer
        forget the region there, so no state of an unmapped region survives its removal
        whoever removes it, and no stat its old datanode reported survives a move."""
        self.apply_listeners: list[Callable[[RegionRoute], None]] = []
        """Called with each route `apply` adds, or moves to another topic."""

    # --- loading ---------------------------------------------------------------------

    async def load(self, progress: Callable[[int], None] | None = None) -> int:
        """Replace the in-memory map with the kv backend's; return the region count.
        `progress` is called (on the worker thread) with the routes read so far.

        Reading, decoding and indexing all happen on a worker thread: at a million
        routes that is seconds of work the event loop must not wait behind.
        """

        async with self._mutate:
            loaded = await asyncio.to_thread(read_map, self._kv, progress)
            self._routes = loaded.by_id
            self._by_topic = loaded.by_topic
            self._malformed = loaded.malformed
            self._checkpoints = {}
            self._uncertain = {}
            self._created = set(loaded.by_topic)
            self._identified = set()
            self.revision = loaded.revision
            self.loaded = True
        logger.info(
            "topic-region map loaded",
            extra={
                "regions": len(loaded.by_id),
                "topics": len(loaded.by_topic),
                "revision": loaded.revision,
            },
        )
        return len(loaded.by_id)

    def apply(self, changes: Sequence[KvChange]) -> None:
        """Follow the kv (a follower's warm map): route keys written or removed, in
        revision order, indexed by the rule a full load follows (`map_route`,
        `unmap_route`), so the map reached is the one a cold load of the same kv gives:
        a put never moves a region off another topic's key, only a delete of that key
        does. A changed checkpoint of a region's route replaces two ints, as a flush does."""
        for change in changes:
            self.revision = max(self.revision, change.revision)
            try:
                topic, region_id = keys.parse_topic_region(change.key)
            except ValueError:
                if change.value is None:
                    self._malformed.discard(change.key)
                else:
                    self._malformed.add(change.key)
                continue
            if change.value is None:
                removed = self._remove_key(topic, region_id)
                if removed is not None:
                    for listener in self.removal_listeners:
                        listener(removed)
                continue
            route = keys.decode_route(change.key, change.value)
            if route is None:
                continue
            held = self._routes.get(region_id)
            entry_id = route.checkpoint_entry_id
            same_key = held is not None and held.topic == topic
            if same_key and held is not None and held.node_id != route.node_id:
                # Moved to another datanode: what was known of it was its old node's.
                self._insert(route)
                for listener in self.removal_listeners:
                    listener(held)
                for listener in self.apply_listeners:
                    listener(route)
                continue
            if same_key and entry_id is not None:
                self._checkpoints[region_id] = _Written(route.node_id, entry_id)
                continue
            new_key = region_id not in self._by_topic.get(topic, {})
            self._insert(route)
            self._created.add(topic)
            if new_key:
                for listener in self.apply_listeners:
                    listener(route)

    def holds_after(self, changes: Sequence[KvChange]) -> int:
        """Route keys (malformed ones included) this map would hold after `apply(changes)`
        of writes only: how the SQL watch finds keys deleted behind it."""
        held = sum(map(len, self._by_topic.values())) + len(self._malformed)
        new: set[str] = set()
        for change in changes:
            if change.value is None or change.key in new:
                continue
            try:
                topic, region_id = keys.parse_topic_region(change.key)
            except ValueError:
                if change.key not in self._malformed:
                    new.add(change.key)
                continue
            if region_id not in self._by_topic.get(topic, {}):
                new.add(change.key)
        return held + len(new)

    def unload(self) -> None:
        """Forget the map (this process stopped leading)."""
        self._routes = {}
        self._by_topic = {}
        self._checkpoints = {}
        self._uncertain = {}
        self._created = set()
        self._identified = set()
        self._malformed = set()
        self.revision = 0
        self.loaded = False

    # --- reads -----------------------------------------------------------------------

    def pool_topics(self) -> list[str]:
        """`{prefix}_{n}` for n < num_topics."""
        return list(self._pool)

    def topics(self) -> list[str]:
        """Pool topics, then any other topic that has regions (sorted)."""
        extra = sorted(t for t in self._by_topic if t not in self._pool_set)
        return [*self._pool, *extra]

    def has_topic(self, topic: str) -> bool:
        """A pool topic, or one with regions mapped to it."""
        return topic in self._pool_set or topic in self._by_topic

    def topic_of(self, region_id: int) -> str | None:
        """The region's mapped topic, or None when it is not registered (builds nothing:
        the registry asks this for every region a checkpoint flush reads)."""
        route = self._routes.get(region_id)
        return None if route is None else route.topic

    def route(self, region_id: int) -> RegionRoute | None:
        """The region's route with its latest checkpoint and node, or None when it is
        not registered."""
        route = self._routes.get(region_id)
        if route is None:
            return None
        written = self._checkpoints.get(region_id)
        if written is None:
            return route
        return RegionRoute(route.region_id, route.topic, written.node_id, written.entry_id)

    @property
    def routes(self) -> Mapping[int, RegionRoute]:
        """Every route by region id (live; do not hold across an `await`). The topic is
        current; node and checkpoint are as loaded or registered: `route()` has the
        latest."""
        return self._routes

    def regions_of(self, topic: str) -> list[RegionRoute]:
        """Every region mapped to `topic` (empty for an unknown topic); node and
        checkpoint as in `routes`."""
        return list(self._by_topic.get(topic, {}).values())

    def routes_by_topic(self) -> dict[str, Mapping[int, RegionRoute]]:
        """Topic -> {region id: route}, for the planner (live: copy or use before the
        next `await`); node and checkpoint as in `routes`."""
        return dict(self._by_topic)

    def routed_by_topic(self) -> dict[str, Mapping[int, RegionRoute]]:
        """`routes_by_topic`, each region under the topic of its route only (a region
        whose key is under two topics, `map_route`, once): what a stat table prepares.
        A copy only when some region is under two topics (O(topics) to tell)."""
        by_topic = self._by_topic
        if sum(map(len, by_topic.values())) == len(self._routes):
            return dict(by_topic)
        routes = self._routes
        return {
            topic: {r: route for r, route in mapped.items() if routes[r].topic == topic}
            for topic, mapped in by_topic.items()
        }

    def region_count(self, topic: str | None = None) -> int:
        """Regions mapped to `topic`, or in total."""
        if topic is None:
            return len(self._routes)
        return len(self._by_topic.get(topic, ()))

    def __len__(self) -> int:
        return len(self._routes)

    async def pruned_entry_ids(self) -> dict[str, int | None]:
        """Every stored `__topic_name/kafka/{topic}` marker (topics never purged are absent)."""

        def read() -> dict[str, int | None]:
            found: dict[str, int | None] = {}
            for kv in self._kv.scan(keys.TOPIC_NAME_PREFIX, page_size=SCAN_PAGE):
                found[kv.key[len(keys.TOPIC_NAME_PREFIX) :]] = _pruned(kv)
            return found

        return await asyncio.to_thread(read)

    async def pruned_entry_id(self, topic: str) -> int | None:
        """One topic's marker, or None if it was never purged."""
        kv = await asyncio.to_thread(self._kv.get, keys.topic_name(topic))
        return None if kv is None else _pruned(kv)

    # --- writes ----------------------------------------------------------------------

    async def register(self, region_id: int, node_id: int, topic: str | None = None) -> RegionRoute:
        """Map a region to `topic`, or to the least-loaded pool topic; idempotent.

        A region registered again with another `node_id` moved to that datanode: its
        route names it from now on (`_move`). Creates the Kafka topic on its first use.
        Raises `Conflict` if the region is already mapped to another topic or the new
        topic's name collides with an existing one (`a.b` vs `a_b`), `InvalidArgument`
        for bad ids or names Kafka refuses.
        """
        if not 0 <= region_id <= ID_MAX:
            raise InvalidArgument(f"region_id must be in [0, 2^64): {region_id}")
        if node_id < 0:
            raise InvalidArgument(f"node_id must be >= 0: {node_id}")
        problem = None if topic is None else topic_name_problem(topic)
        if problem is not None:
            raise InvalidArgument(f"not a valid Kafka topic name: {topic!r} ({problem})")
        existing = self._existing(region_id, topic)
        if existing is not None:
            return existing if existing.node_id == node_id else await self._move(existing, node_id)

        # A retry after an unknown outcome goes where the first attempt went.
        chosen = topic or self._uncertain.get(region_id) or self._least_loaded()
        self._reserved[chosen] += 1
        try:
            async with self._locks.read(chosen), self._mutate:
                await self._settle(region_id)
                existing = self._existing(region_id, topic)
                if existing is None:
                    if chosen not in self._created:
                        await self._ensure_topics([chosen])
                    if chosen not in self._identified:
                        await self._record_topic_id(chosen)
                    route = await self._create(region_id, node_id, chosen)
        finally:
            self._reserved[chosen] -= 1
            if not self._reserved[chosen]:
                del self._reserved[chosen]
        if existing is not None:  # registered meanwhile
            return existing if existing.node_id == node_id else await self._move(existing, node_id)
        logger.info(
            "region registered",
            extra={"region_id": region_id, "topic": route.topic, "node_id": route.node_id},
        )
        return route

    async def _create(self, region_id: int, node_id: int, topic: str) -> RegionRoute:
        """Write a new route (the caller holds the topic's shared lock and `_mutate`)."""
        key = keys.topic_region(topic, region_id)
        try:
            result = await asyncio.to_thread(
                self._kv.txn,
                [*self.fence(), Compare(key, revision=0)],
                [Put(key, keys.encode_route(node_id, None))],
            )
        except KvUnavailable:
            # The write may have landed (a lost answer, a timeout): re-read before
            # answering, and until that read succeeds, a retry re-reads first and
            # writes to this topic only, never to a second one.
            self._uncertain[region_id] = topic
            await self._settle(region_id)
            adopted = self._routes.get(region_id)
            if adopted is None:
                raise
            return adopted
        if not result.succeeded:
            stored = await asyncio.to_thread(self._kv.get, key)
            if stored is None:
                raise LeadershipLost("lost leadership while registering a region")
            # Written by an earlier leader after our load: adopt it.
            adopted = keys.decode_route(stored.key, stored.value)
            assert adopted is not None
            self._insert(adopted)
            return adopted
        route = RegionRoute(
            region_id=region_id, topic=topic, node_id=node_id, checkpoint_entry_id=None
        )
        self._insert(route)
        return route

    async def _record_topic_id(self, topic: str) -> None:
        """Make the topic's marker record Kafka's topic id before a route is written on it
        (`keys.registered_marker`; the caller holds the topic's shared lock and `_mutate`).
        Every region's reports then belong to a known topic: one deleted and recreated
        before its first purge is a topic reset, not a topic to cut by the old reports.
        Once per topic per term; `KafkaUnavailable` when Kafka does not name the topic's id
        (the registration is refused, to be retried, rather than left unchecked)."""
        key = keys.topic_name(topic)
        stored = await asyncio.to_thread(self._kv.get, key)
        try:
            marker = None if stored is None else keys.read_marker(stored.key, stored.value)
        except DamagedMarker:
            # Left for the purge to report (it plans nothing under it); never written over.
            self._identified.add(topic)
            return
        if marker is not None and (marker.topic_id is not None or marker.reset is not None):
            self._identified.add(topic)
            return
        topic_id = await asyncio.to_thread(self._kafka.topic_id, topic)
        recorded = keys.registered_marker(marker, topic_id)
        assert recorded is not None
        result = await asyncio.to_thread(
            self._kv.txn,
            [*self.fence(), Compare(key, revision=stored.mod_revision if stored else 0)],
            [Put(key, keys.encode_marker(recorded, stored.value if stored else None))],
        )
        if not result.succeeded:
            # Purges and resolve-reset write the marker under the exclusive lock, so only
            # the fence can have failed (or an earlier attempt whose answer was lost landed).
            again = await asyncio.to_thread(self._kv.get, key)
            if again is None or keys.decode_marker(again.value).topic_id is None:
                raise LeadershipLost("lost leadership while recording a topic id")
        self._identified.add(topic)
        logger.info("topic id recorded", extra={"topic": topic, "topic_id": topic_id})

    async def _move(self, route: RegionRoute, node_id: int) -> RegionRoute:
        """Route a registered region to another datanode (it moved): its checkpoint is
        kept, what this leader holds of it is forgotten (`removal_listeners`), so its old
        datanode's reports are no longer trusted (rejected as `wrong_node`)."""
        region_id = route.region_id
        async with self._locks.read(route.topic), self._mutate:
            current = self._routes.get(region_id)
            if current is None:
                raise NotFound(f"region {region_id} is not registered")
            if current.node_id == node_id:
                return current
            key = keys.topic_region(current.topic, region_id)
            stored = await asyncio.to_thread(self._kv.get, key)
            held = None if stored is None else keys.decode_route(stored.key, stored.value)
            if stored is None or held is None:
                raise Conflict(
                    f"the route of region {region_id} was removed behind this leader",
                    details={"region_id": region_id, "topic": current.topic},
                )
            if held.node_id != node_id:  # else: an earlier attempt of ours landed
                result = await asyncio.to_thread(
                    self._kv.txn,
                    [*self.fence(), Compare(key, revision=stored.mod_revision)],
                    [Put(key, keys.encode_route(node_id, held.checkpoint_entry_id))],
                )
                if not result.succeeded:
                    raise Conflict(
                        f"the route of region {region_id} changed while it was moved; retry",
                        details={"region_id": region_id, "topic": current.topic},
                    )
            moved = RegionRoute(region_id, current.topic, node_id, held.checkpoint_entry_id)
            self._insert(moved)
            for listener in self.removal_listeners:
                listener(current)
        logger.info(
            "region moved to another datanode",
            extra={"region_id": region_id, "topic": moved.topic, "node_id": node_id},
        )
        return moved

    async def _settle(self, region_id: int) -> None:
        """Re-read a registration of `region_id` whose outcome is unknown: adopt it if it
        landed, forget it if it did not (raises `KvUnavailable` while unreadable)."""
        topic = self._uncertain.get(region_id)
        if topic is None:
            return
        stored = await asyncio.to_thread(self._kv.get, keys.topic_region(topic, region_id))
        del self._uncertain[region_id]
        route = None if stored is None else keys.decode_route(stored.key, stored.value)
        if route is not None and region_id not in self._routes:
            self._insert(route)
            logger.info(
                "registration with an unknown outcome had landed",
                extra={"region_id": region_id, "topic": topic},
            )

    async def create_pool(self) -> list[str]:
        """Create every pool topic Kafka lacks (`wal.auto_create_topics`, GreptimeDB's
        start-up behaviour); returns the ones created. A no-op when the setting is off."""
        if not self._settings.wal.auto_create_topics:
            return []
        return await self._ensure_topics(self._pool)

    async def _ensure_topics(self, topics: list[str]) -> list[str]:
        """Create missing `topics` with `[wal]`'s topic settings; with auto-creation off,
        refuse a topic Kafka does not have (metasrv never creates one then)."""
        wal = self._settings.wal
        if not wal.auto_create_topics:
            existing = await asyncio.to_thread(self._kafka.list_topics)
            missing = sorted(set(topics) - existing)
            if missing:
                raise InvalidArgument(
                    f"kafka topics {missing} do not exist and wal.auto_create_topics is false"
                )
            self._created.update(topics)
            return []
        await self._refuse_reset_topics(topics)
        created = await asyncio.to_thread(
            self._kafka.ensure_topics,
            topics,
            replication_factor=wal.replication_factor,
            num_partitions=wal.num_partitions,
            config=wal.topic_creation_config(),
            create_timeout=wal.create_topic_timeout,
        )
        self._created.update(topics)
        return created

    async def _refuse_reset_topics(self, topics: list[str]) -> None:
        """`TopicReset` when one of `topics` is missing from Kafka although it has a marker
        (regions were registered on it, or it was purged): creating it again would start
        its offsets at 0 under a marker that says otherwise (DESIGN §2 invariant 8)."""
        existing = await asyncio.to_thread(self._kafka.list_topics)
        for topic in sorted(set(topics) - existing):
            if await asyncio.to_thread(self._kv.get, keys.topic_name(topic)) is not None:
                raise TopicReset(
                    f"kafka topic {topic} is missing but metasrv has a marker for it (regions "
                    "were registered on it): not created again; a topic reset must be "
                    f"resolved by an operator (create the topic, then POST "
                    f"/v1/topics/{topic}/resolve-reset)",
                    details={"topic": topic},
                )

    async def deregister(self, region_id: int) -> RegionRoute:
        """Remove a region from the map; `NotFound` if it is not registered."""
        route = self._routes.get(region_id)
        if route is None:
            raise NotFound(f"region {region_id} is not registered")
        async with self._locks.read(route.topic), self._mutate:
            route = self._routes.get(region_id)
            if route is None:
                raise NotFound(f"region {region_id} is not registered")
            result = await asyncio.to_thread(
                self._kv.txn,
                list(self.fence()),
                [Delete(keys.topic_region(route.topic, region_id))],
            )
            if not result.succeeded:
                raise LeadershipLost("lost leadership while deregistering a region")
            self._remove(route)
            for listener in self.removal_listeners:
                listener(route)
        logger.info("region deregistered", extra={"region_id": region_id, "topic": route.topic})
        return route

    async def set_checkpoints(self, updates: Mapping[int, tuple[int, int]]) -> int:
        """Persist `region_id -> (node_id, prunable entry id)` checkpoints; return keys written.

        Regions no longer mapped are skipped (a removed region is never resurrected), and
        so are unchanged checkpoints. One `batch_update`, chunked by the backend: every
        chunk carries the election's fence and writes only route keys that still exist,
        so a deposed leader's late slice never lands and a route deleted behind this
        map (by a new leader, or by hand) is never recreated. Raises `LeadershipLost`
        when a chunk found the fence broken (chunks before it may have landed).
        """
        async with self._mutate:
            items: list[tuple[str, bytes]] = []
            changed: list[tuple[int, str, tuple[int, int]]] = []
            routes = self._routes
            written = self._checkpoints
            for region_id, checkpoint in updates.items():
                route = routes.get(region_id)
                if route is None:
                    continue
                prior = written.get(region_id)
                if prior is None:
                    if (route.node_id, route.checkpoint_entry_id) == checkpoint:
                        continue
                elif (prior.node_id, prior.entry_id) == checkpoint:
                    continue
                node_id, entry_id = checkpoint
                key = keys.topic_region(route.topic, region_id)
                items.append((key, keys.encode_route(node_id, entry_id)))
                changed.append((region_id, route.topic, checkpoint))
            if not items:
                return 0
            result = await asyncio.to_thread(self._kv.batch_update, items, self.fence())
            landed = set(result.written)
            gone = 0
            for (key, _), (region_id, topic, checkpoint) in zip(items, changed, strict=True):
                if key not in landed:
                    gone += not result.fenced
                    continue
                # `unload()` may have run during the write (leadership lost): re-check.
                current = self._routes.get(region_id)
                if current is not None and current.topic == topic:
                    written[region_id] = _Written(*checkpoint)
        if result.fenced:
            raise LeadershipLost("lost leadership while writing checkpoints")
        if gone:
            # The map holds routes the kv no longer has: removed behind this leader.
            logger.warning(
                "checkpoints of routes absent from the kv not written",
                extra={"regions": gone},
            )
        return len(landed)

    # --- internals -------------------------------------------------------------------

    def _existing(self, region_id: int, topic: str | None) -> RegionRoute | None:
        existing = self._routes.get(region_id)
        if existing is None:
            return None
        if topic is not None and existing.topic != topic:
            raise Conflict(
                f"region {region_id} is already registered on topic {existing.topic}",
                details={"region_id": region_id, "topic": existing.topic},
            )
        return existing

    def _least_loaded(self) -> str:
        # Ties go to the lowest pool index, so an empty pool fills round-robin. Regions
        # being registered right now count, so concurrent registrations spread out.
        counts = self._by_topic
        reserved = self._reserved
        return min(
            self._pool,
            key=lambda t: len(counts.get(t, ())) + reserved.get(t, 0),
        )

    def _insert(self, route: RegionRoute) -> None:
        if map_route(self._routes, self._by_topic, route):
            self._checkpoints.pop(route.region_id, None)

    def _remove(self, route: RegionRoute) -> None:
        self._remove_key(route.topic, route.region_id)

    def _remove_key(self, topic: str, region_id: int) -> RegionRoute | None:
        held = self._routes.get(region_id)
        removed = unmap_route(self._routes, self._by_topic, topic, region_id)
        if removed is not None and held is not None and held.topic == topic:
            self._checkpoints.pop(region_id, None)  # the region's route is another, or none
        return removed
