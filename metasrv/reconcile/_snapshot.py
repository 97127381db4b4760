"""A consistent snapshot of the kv topic-region map and topic markers, staged as Parquet.

The map and the markers must come from one instant, or a region moved between two
topics while we read could show up twice or not at all. On etcd every page is read at
the revision of the first one; on SQL everything is read in one read-only transaction
(REPEATABLE READ on PostgreSQL, one deferred transaction on SQLite's WAL, which both see
a single snapshot). Regions stream into a Parquet file in batches, so a map of millions
of keys never sits in driver memory as Python objects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import and_, select

from metasrv import keys
from metasrv.errors import KvUnavailable, MetasrvError
from metasrv.kv._protocol import KeyValue
from metasrv.reconcile._findings import MAP_SCHEMA
from metasrv.reconcile._store import sql_error_detail
from metasrv.sql_schema import kv_revision_table, kv_table

if TYPE_CHECKING:
    from metasrv.kv import EtcdKv, KvBackend, SqlKv

logger = logging.getLogger(__name__)

PAGE = 5000
"""Keys per etcd range request / rows per SQL fetch."""

_BATCH = 100_000
"""Map rows per Parquet row group."""


@dataclass(frozen=True, slots=True)
class KvSnapshot:
    """The staged snapshot."""

    map_path: str
    """Parquet file of `MAP_SCHEMA` rows."""
    markers: dict[str, int | None]
    """topic -> `pruned_entry_id` from `__topic_name/kafka/{topic}`."""
    revision: int
    """Store revision the snapshot was read at."""
    regions: int
    """Topic-region keys read."""
    map_topics: frozenset[str]
    """Topics with at least one mapped region."""
    malformed: int
    """Keys that could not be parsed (skipped, logged)."""


def _range_end(prefix: bytes) -> bytes:
    """etcd's range end for "every key starting with prefix"."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _etcd_scan(kv: EtcdKv, prefixes: list[str]) -> tuple[int, dict[str, Iterator[KeyValue]]]:
    """Pages of each prefix, all at the revision of the first request."""
    from pyetcd import etcdrpc

    stub = kv.client.kvstub
    head = kv.key_prefix.encode()
    probe = etcdrpc.RangeRequest(key=head or b"\0", limit=1)
    first = _etcd_call(kv, lambda: stub.Range(probe, kv.timeout))
    revision = int(first.header.revision)

    def pages(prefix: str) -> Iterator[KeyValue]:
        lo = head + prefix.encode()
        hi = _range_end(lo)
        start = lo
        while True:
            req = etcdrpc.RangeRequest(key=start, range_end=hi, limit=PAGE, revision=revision)
            resp = _etcd_call(kv, partial(stub.Range, req, kv.timeout))
            for item in resp.kvs:
                yield KeyValue(
                    bytes(item.key)[len(head) :].decode(), bytes(item.value), int(item.mod_revision)
                )
            if not resp.more or not resp.kvs:
                return
            start = bytes(resp.kvs[-1].key) + b"\0"

    return revision, {p: pages(p) for p in prefixes}


def _etcd_call(kv: EtcdKv, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # grpc.RpcError and pyetcd's own errors
        text = str(getattr(exc, "details", lambda: "")() or exc).strip().splitlines()
        detail = text[0] if text else type(exc).__name__
        if "compacted" in detail:
            raise KvUnavailable(
                f"etcd compacted revision history while the snapshot was read ({detail}); "
                "run reconcile again"
            ) from exc
        raise KvUnavailable(f"etcd at {', '.join(kv.endpoints)} unreachable: {detail}") from exc


def _write_map(
    routes: Iterator[KeyValue], path: Path, on_rows: Callable[[int], None]
) -> tuple[int, set[str], int]:
    # Imported here: metasrv.topology imports metasrv.kv, which imports metasrv.sql_schema,
    # which imports this package's tables (a cycle if done at module level).
    from metasrv.topology import parse_route

    count = malformed = 0
    topics: set[str] = set()
    cols: dict[str, list[Any]] = {n: [] for n in MAP_SCHEMA.names}
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, MAP_SCHEMA, compression="zstd") as writer:

        def flush() -> None:
            if cols["region_id"]:
                writer.write_table(pa.Table.from_pydict(cols, schema=MAP_SCHEMA))
                on_rows(len(cols["region_id"]))
                for v in cols.values():
                    v.clear()

        for item in routes:
            route = parse_route(item)
            if route is None:
                malformed += 1
                continue
            cols["region_id"].append(route.region_id)
            cols["topic"].append(route.topic)
            cols["node_id"].append(route.node_id)
            cols["checkpoint_entry_id"].append(route.checkpoint_entry_id)
            topics.add(route.topic)
            count += 1
            if len(cols["region_id"]) >= _BATCH:
                flush()
        flush()
    return count, topics, malformed


def _markers(items: Iterator[KeyValue]) -> tuple[dict[str, int | None], int]:
    found: dict[str, int | None] = {}
    malformed = 0
    for item in items:
        topic = item.key[len(keys.TOPIC_NAME_PREFIX) :]
        try:
            value = orjson.loads(item.value)
            pruned = value.get("pruned_entry_id") if isinstance(value, dict) else None
        except orjson.JSONDecodeError:
            malformed += 1
            pruned = None
        found[topic] = pruned if type(pruned) is int else None
    return found, malformed


def read_snapshot(
    kv: KvBackend, map_path: Path, on_rows: Callable[[int], None] = lambda n: None
) -> KvSnapshot:
    """Read the map and markers at one instant; stream the map to `map_path`.

    `on_rows(n)` is called after each batch of n regions (progress display).
    Raises `KvUnavailable` naming the backend when it cannot be read.
    """
    from metasrv.kv import EtcdKv, SqlKv

    prefixes = [keys.TOPIC_NAME_PREFIX, keys.TOPIC_REGION_PREFIX]
    if isinstance(kv, EtcdKv):
        revision, scans = _etcd_scan(kv, prefixes)
        markers, bad_markers = _markers(scans[keys.TOPIC_NAME_PREFIX])
        count, topics, bad = _write_map(scans[keys.TOPIC_REGION_PREFIX], map_path, on_rows)
    elif isinstance(kv, SqlKv):
        revision, markers, bad_markers, count, topics, bad = _sql_snapshot(kv, map_path, on_rows)
    else:
        raise MetasrvError(f"reconcile cannot snapshot a {type(kv).__name__} kv backend")
    malformed = bad + bad_markers
    if malformed:
        logger.warning("malformed kv keys skipped in the snapshot", extra={"count": malformed})
    return KvSnapshot(str(map_path), markers, revision, count, frozenset(topics), malformed)


def _sql_snapshot(
    kv: SqlKv, map_path: Path, on_rows: Callable[[int], None]
) -> tuple[int, dict[str, int | None], int, int, set[str], int]:
    import sqlalchemy.exc as sa_exc

    engine = kv.engine
    strip = len(kv.key_prefix)

    def rows(conn: Any, prefix: str) -> Iterator[KeyValue]:
        lo = kv.key_prefix + prefix
        hi = lo[:-1] + chr(ord(lo[-1]) + 1)
        stmt = (
            select(kv_table.c.key, kv_table.c.value, kv_table.c.mod_revision)
            .where(and_(kv_table.c.key >= lo, kv_table.c.key < hi))
            .order_by(kv_table.c.key)
        )
        result = conn.execution_options(stream_results=True, yield_per=PAGE).execute(stmt)
        for key, value, rev in result:
            yield KeyValue(key[strip:], bytes(value), int(rev))

    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn = conn.execution_options(
                    isolation_level="REPEATABLE READ", postgresql_readonly=True
                )
            with conn.begin():
                revision = int(
                    conn.execute(
                        select(kv_revision_table.c.revision).where(kv_revision_table.c.id == 1)
                    ).scalar_one_or_none()
                    or 0
                )
                markers, bad_markers = _markers(rows(conn, keys.TOPIC_NAME_PREFIX))
                count, topics, bad = _write_map(
                    rows(conn, keys.TOPIC_REGION_PREFIX), map_path, on_rows
                )
    except sa_exc.SQLAlchemyError as exc:
        raise KvUnavailable(f"kv database {kv!r} unreachable: {sql_error_detail(exc)}") from exc
    return revision, markers, bad_markers, count, topics, bad
