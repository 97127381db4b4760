"""A consistent snapshot of the kv topic-region map and topic markers, staged as Parquet.

The map and the markers must come from one instant, or a region moved between two
topics while we read could show up twice or not at all. On etcd every page is read at
the revision of the first one; on SQL everything is read in one read-only transaction
(REPEATABLE READ on PostgreSQL, one deferred transaction on SQLite's WAL, which both see
a single snapshot). Regions stream into a Parquet file in batches, so a map of millions
of keys never sits in driver memory as Python objects.

Each page of keys is decoded column-wise by Arrow: the key's topic and region id with
string kernels, the JSON values with Arrow's JSON reader, so no Python object is built
per region beyond the key and value the driver hands over. A page that does not decode
cleanly that way (a malformed key, a value of an unexpected shape) is decoded key by key
with `keys.decode_route`, which keeps a damaged region mapped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq
from sqlalchemy import and_, func, select, text

from metasrv import keys
from metasrv.errors import KvUnavailable, MetasrvError
from metasrv.reconcile._findings import MAP_SCHEMA
from metasrv.reconcile._store import sql_error_detail
from metasrv.sql import kv_revision_table, kv_table

if TYPE_CHECKING:
    from metasrv.kv import EtcdKv, KvBackend, SqlKv

logger = logging.getLogger(__name__)

PAGE = 20_000
"""Keys per etcd range request / rows per SQL fetch (about 2 MB of routes)."""

_VALUE_SCHEMA = pa.schema(
    [
        pa.field("node_id", pa.int64()),
        pa.field("checkpoint", pa.struct([pa.field("entry_id", pa.int64())])),
    ]
)
_JSON_PARSE = pajson.ParseOptions(explicit_schema=_VALUE_SCHEMA, unexpected_field_behavior="ignore")


@dataclass(frozen=True, slots=True)
class Page:
    """One page of raw keys (without the kv key prefix) and their values."""

    keys: Sequence[str | bytes]
    """str from SQL, bytes from etcd."""
    values: Sequence[bytes]


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


def _etcd_scan(kv: EtcdKv, prefixes: list[str]) -> tuple[int, dict[str, Iterator[Page]]]:
    """Pages of each prefix, all at the revision of the first request."""
    from pyetcd import etcdrpc

    stub = kv.client.kvstub
    head = kv.key_prefix.encode()
    probe = etcdrpc.RangeRequest(key=head or b"\0", limit=1)
    first = _etcd_call(kv, lambda: stub.Range(probe, kv.timeout))
    revision = int(first.header.revision)

    def pages(prefix: str) -> Iterator[Page]:
        lo = head + prefix.encode()
        hi = _range_end(lo)
        start = lo
        cut = len(head)
        while True:
            req = etcdrpc.RangeRequest(key=start, range_end=hi, limit=PAGE, revision=revision)
            resp = _etcd_call(kv, partial(stub.Range, req, kv.timeout))
            items = resp.kvs
            if items:
                yield Page([i.key[cut:] for i in items], [i.value for i in items])
            if not resp.more or not items:
                return
            start = bytes(items[-1].key) + b"\0"

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


def _decode_fast(page: Page) -> pa.Table | None:
    """`MAP_SCHEMA` rows of a page decoded column-wise, or None when any key or value
    does not decode exactly as `keys.decode_route` would decode it."""
    try:
        if page.keys and isinstance(page.keys[0], bytes):
            raw = pa.array(page.keys, pa.binary()).cast(pa.string())
        else:
            raw = pa.array(page.keys, pa.string())
        rest = pc.utf8_slice_codeunits(raw, len(keys.TOPIC_REGION_PREFIX))
        parts = pc.split_pattern(rest, "/", max_splits=1, reverse=True)
        if pc.min(pc.list_value_length(parts)).as_py() != 2:
            return None
        topic = pc.list_element(parts, 0)
        region_text = pc.list_element(parts, 1)
        # Only plain decimal digits: what int() reads the same way.
        if not pc.all(pc.match_substring_regex(region_text, r"^[0-9]{1,19}$")).as_py():
            return None
        region_id = pc.cast(region_text, pa.int64())
        lines = b"\n".join(page.values)
        # One line per value, or the rows would not line up with the keys.
        if lines.count(b"\n") != len(page.values) - 1:
            return None
        values = pajson.read_json(pa.py_buffer(lines), parse_options=_JSON_PARSE)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    if values.num_rows != len(page.values):
        return None
    checkpoint = values.column("checkpoint").combine_chunks()
    return pa.table(
        {
            "region_id": region_id,
            "topic": topic,
            "node_id": pc.fill_null(values.column("node_id"), -1),
            "checkpoint_entry_id": pc.struct_field(checkpoint, [0]),
        },
        schema=MAP_SCHEMA,
    )


def _decode_slow(page: Page) -> tuple[pa.Table, int]:
    """The page key by key through `keys.decode_route`; returns the rows and the malformed
    count."""
    cols: dict[str, list[Any]] = {n: [] for n in MAP_SCHEMA.names}
    malformed = 0
    for key, value in zip(page.keys, page.values, strict=True):
        text = key.decode(errors="replace") if isinstance(key, bytes) else key
        route = keys.decode_route(text, bytes(value))
        if route is None:
            malformed += 1
            continue
        cols["region_id"].append(route.region_id)
        cols["topic"].append(route.topic)
        cols["node_id"].append(route.node_id)
        cols["checkpoint_entry_id"].append(route.checkpoint_entry_id)
    return pa.Table.from_pydict(cols, schema=MAP_SCHEMA), malformed


def _write_map(
    pages: Iterator[Page], path: Path, on_rows: Callable[[int], None]
) -> tuple[int, set[str], int]:
    count = malformed = 0
    topics: set[str] = set()
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, MAP_SCHEMA, compression="zstd") as writer:
        for page in pages:
            table = _decode_fast(page)
            if table is None:
                table, bad = _decode_slow(page)
                malformed += bad
            if table.num_rows:
                writer.write_table(table)
                topics.update(pc.unique(table.column("topic")).to_pylist())
                count += table.num_rows
                on_rows(table.num_rows)
    return count, topics, malformed


def _markers(pages: Iterator[Page]) -> tuple[dict[str, int | None], int]:
    found: dict[str, int | None] = {}
    malformed = 0
    for key, raw in ((k, v) for page in pages for k, v in zip(page.keys, page.values, strict=True)):
        text = key.decode(errors="replace") if isinstance(key, bytes) else key
        topic = text[len(keys.TOPIC_NAME_PREFIX) :]
        try:
            found[topic] = keys.decode_pruned(raw)
        except ValueError:
            malformed += 1
            found[topic] = None
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

    def rows(conn: Any, prefix: str) -> Iterator[Page]:
        lo = kv.key_prefix + prefix
        hi = lo[:-1] + chr(ord(lo[-1]) + 1)
        in_range: Any = and_(kv_table.c.key >= lo, kv_table.c.key < hi)
        if engine.dialect.name == "sqlite":
            # `+key` keeps SQLite off the primary-key index: walking the index visits the
            # table in key order, page by random page (6x slower than one scan in rowid
            # order for a map that is most of the table). PostgreSQL's planner picks.
            in_range = text("+key >= :lo AND +key < :hi").bindparams(lo=lo, hi=hi)
        # The kv prefix is cut by the database, so the driver gets keys ready to decode.
        stmt = select(func.substr(kv_table.c.key, strip + 1), kv_table.c.value).where(in_range)
        # Straight from a DBAPI cursor (a server-side one on PostgreSQL, in the snapshot's
        # transaction): plain tuples, no SQLAlchemy Row per region.
        compiled = stmt.compile(dialect=engine.dialect)
        params: Any = compiled.params
        if compiled.positional:
            params = tuple(params[name] for name in compiled.positiontup or ())
        dbapi = conn.connection.driver_connection
        is_pg = engine.dialect.name == "postgresql"
        cursor = dbapi.cursor(name="metasrv_kv_snapshot") if is_pg else dbapi.cursor()
        try:
            cursor.execute(compiled.string, params)
            while part := cursor.fetchmany(PAGE):
                keys_, values = zip(*part, strict=True)
                yield Page(keys_, values)
        finally:
            cursor.close()

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
