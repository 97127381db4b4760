"""A consistent snapshot of the kv topic-region map and topic markers, staged as Parquet.

The map and the markers must come from one instant, or a region moved between two
topics while we read could show up twice or not at all: both are read from one
`KvBackend.snapshot()`, the store as of one revision on every backend. Regions stream
into a Parquet file page by page, so a map of millions of keys never sits in driver
memory as Python objects.

Each page of keys is decoded column-wise by Arrow (`keys.decode_route_page`: the key's
topic and region id with string kernels, the JSON values with Arrow's JSON reader), so no
Python object is built per region beyond the key and value the store hands over. A page
that does not decode cleanly that way (a malformed key, a value of an unexpected shape) is
decoded key by key with `keys.decode_route`, which keeps a damaged region mapped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metasrv import keys
from metasrv.kv import KeyPage, KvBackend
from metasrv.reconcile._findings import MAP_SCHEMA

logger = logging.getLogger(__name__)

PAGE = 20_000
"""Keys per page of the snapshot read (about 2 MB of routes)."""


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


def _decode_fast(page: KeyPage) -> pa.Table | None:
    """`MAP_SCHEMA` rows of a page decoded column-wise (`keys.decode_route_page`), or None
    when any key or value does not decode exactly as `keys.decode_route` would decode it."""
    columns = keys.decode_route_page(page.keys, page.values)
    return None if columns is None else pa.table(columns, schema=MAP_SCHEMA)


def _decode_slow(page: KeyPage) -> tuple[pa.Table, int]:
    """The page key by key through `keys.decode_route`; returns the rows and the malformed
    count."""
    cols: dict[str, list[Any]] = {n: [] for n in MAP_SCHEMA.names}
    malformed = 0
    for key, value in zip(page.keys, page.values, strict=True):
        route = keys.decode_route(key, bytes(value))
        if route is None:
            malformed += 1
            continue
        cols["region_id"].append(route.region_id)
        cols["topic"].append(route.topic)
        cols["node_id"].append(route.node_id)
        cols["checkpoint_entry_id"].append(route.checkpoint_entry_id)
    return pa.Table.from_pydict(cols, schema=MAP_SCHEMA), malformed


def _write_map(
    pages: Iterator[KeyPage], path: Path, on_rows: Callable[[int], None]
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


def _markers(pages: Iterator[KeyPage]) -> tuple[dict[str, int | None], int]:
    found: dict[str, int | None] = {}
    malformed = 0
    for key, raw in ((k, v) for page in pages for k, v in zip(page.keys, page.values, strict=True)):
        marker = keys.marker_or_none(key, raw)
        topic = key[len(keys.TOPIC_NAME_PREFIX) :]
        found[topic] = None if marker is None else marker.pruned_entry_id
        malformed += marker is None
    return found, malformed


def read_snapshot(
    kv: KvBackend,
    map_path: Path,
    on_rows: Callable[[int], None] = lambda n: None,
    *,
    page_size: int = PAGE,
) -> KvSnapshot:
    """Read the map and markers at one instant; stream the map to `map_path`.

    `on_rows(n)` is called after each page of n regions (progress display). Raises
    `KvUnavailable` naming the backend when it cannot be read.
    """
    with kv.snapshot() as snap:
        markers, bad_markers = _markers(snap.pages(keys.TOPIC_NAME_PREFIX, page_size=page_size))
        count, topics, bad = _write_map(
            snap.pages(keys.TOPIC_REGION_PREFIX, page_size=page_size), map_path, on_rows
        )
        revision = snap.revision
    malformed = bad + bad_markers
    if malformed:
        logger.warning("malformed kv keys skipped in the snapshot", extra={"count": malformed})
    return KvSnapshot(str(map_path), markers, revision, count, frozenset(topics), malformed)
