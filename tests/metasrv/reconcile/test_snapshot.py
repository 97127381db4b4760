"""The kv snapshot on real etcd, PostgreSQL and SQLite: complete, parsed, consistent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from metasrv import keys
from metasrv.errors import KvUnavailable
from metasrv.kv import EtcdKv, KvBackend, SqlKv
from metasrv.model import RegionRoute
from metasrv.reconcile import read_snapshot


def _seed(kv: KvBackend, n: int) -> None:
    items = [
        (keys.topic_region(f"t_{i % 3}", 1000 + i), keys.encode_route(i % 5, i if i % 2 else None))
        for i in range(n)
    ]
    items += [
        (keys.topic_name("t_0"), orjson.dumps({"pruned_entry_id": 7})),
        (keys.topic_name("t_1"), orjson.dumps({"pruned_entry_id": None})),
        (keys.topic_name("t_9"), b"not json"),
    ]
    kv.batch_put(items)


def test_snapshot_reads_every_region_and_marker(any_kv: KvBackend, tmp_path: Path) -> None:
    _seed(any_kv, 250)
    # Another key family under the same store must not leak in.
    any_kv.put("__procedure__/x/state", b"{}")
    seen: list[int] = []
    snap = read_snapshot(any_kv, tmp_path / "map.parquet", seen.append)
    rows = sorted(pq.read_table(snap.map_path).to_pylist(), key=lambda r: r["region_id"])
    assert len(rows) == snap.regions == sum(seen) == 250
    assert rows[0] == {"region_id": 1000, "topic": "t_0", "node_id": 0, "checkpoint_entry_id": None}
    assert rows[3] == {"region_id": 1003, "topic": "t_0", "node_id": 3, "checkpoint_entry_id": 3}
    assert snap.map_topics == {"t_0", "t_1", "t_2"}
    assert snap.markers == {"t_0": 7, "t_1": None, "t_9": None}
    assert snap.malformed == 1
    assert snap.revision > 0


def test_snapshot_ignores_writes_made_while_it_reads(any_kv: KvBackend, tmp_path: Path) -> None:
    """The markers and every page of the map come from one revision of the store."""
    kv = any_kv
    _seed(kv, 40)
    pages: list[int] = []

    def write_after_the_first_page(rows: int) -> None:
        pages.append(rows)
        if len(pages) == 1:
            # A region moves, a new one appears and a marker moves mid-read.
            kv.delete(keys.topic_region("t_2", 1038))
            kv.put(keys.topic_region("t_0", 1038), keys.encode_route(1, None))
            kv.put(keys.topic_region("t_1", 5000), keys.encode_route(1, None))
            kv.put(keys.topic_name("t_0"), orjson.dumps({"pruned_entry_id": 8}))

    snap = read_snapshot(kv, tmp_path / "map.parquet", write_after_the_first_page, page_size=10)
    assert len(pages) == 4
    rows = pq.read_table(snap.map_path).to_pylist()
    by_region = {r["region_id"]: r["topic"] for r in rows}
    assert len(rows) == 40
    assert by_region[1038] == "t_2"
    assert 5000 not in by_region
    assert snap.markers["t_0"] == 7
    # The writes did land: a new snapshot sees them.
    again = read_snapshot(kv, tmp_path / "again.parquet")
    rows = pq.read_table(again.map_path).to_pylist()
    assert {r["region_id"]: r["topic"] for r in rows}[1038] == "t_0"
    assert len(rows) == 41
    assert again.markers["t_0"] == 8
    assert again.revision > snap.revision


def test_unreachable_backends_are_named(tmp_path: Path) -> None:
    kv = EtcdKv(["127.0.0.1:1"], "x/", timeout=1.0)
    try:
        with pytest.raises(KvUnavailable, match=r"etcd at 127\.0\.0\.1:1 unreachable"):
            read_snapshot(kv, tmp_path / "a.parquet")
    finally:
        kv.close()
    sql = SqlKv("postgresql://nobody:pw@127.0.0.1:1/none")
    try:
        with pytest.raises(KvUnavailable, match=r"kv database .*127\.0\.0\.1:1.* unreachable"):
            read_snapshot(sql, tmp_path / "b.parquet")
    finally:
        sql.close()


_ODD_ROUTES: list[tuple[str, bytes]] = [
    (keys.topic_region("t_0", 1), keys.encode_route(3, 9)),
    (keys.topic_region("t/with/slash", 2), keys.encode_route(4, None)),
    (keys.topic_region("tópico", 3), b'{"node_id": 5, "checkpoint": null, "extra": [1]}'),
    (keys.topic_region("t_0", 4), b"not json"),
    (keys.topic_region("t_0", 5), b'{"node_id": "7", "checkpoint": {"entry_id": 1}}'),
    (keys.topic_region("t_0", 6), b'{"node_id": true, "checkpoint": null}'),
    (keys.topic_region("t_0", 7), b'{\n "node_id": 1,\n "checkpoint": null\n}'),
    (keys.topic_region("t_0", 8), b'{"node_id": 2, "checkpoint": {"entry_id": 1.5}}'),
    (keys.topic_region("t_0", 9), b"[]"),
    (keys.topic_region("t_0", 10), b'{"node_id": 2}'),
    (keys.topic_region("t_0", 11), b""),
    (f"{keys.TOPIC_REGION_PREFIX}no_region_id", keys.encode_route(1, None)),
    (f"{keys.TOPIC_REGION_PREFIX}t_0/12x", keys.encode_route(1, None)),
    (f"{keys.TOPIC_REGION_PREFIX}t_0/+13", keys.encode_route(1, None)),
]


def _expected(items: list[tuple[str, bytes]]) -> list[dict[str, object]]:
    routes = [keys.decode_route(k, v) for k, v in items]
    return [
        {
            "region_id": r.region_id,
            "topic": r.topic,
            "node_id": r.node_id,
            "checkpoint_entry_id": r.checkpoint_entry_id,
        }
        for r in routes
        if r is not None
    ]


@pytest.fixture
def memory_kv() -> Iterator[KvBackend]:
    kv = SqlKv.open("sqlite://", create=True)
    yield kv
    kv.close()


@pytest.mark.parametrize("index", range(len(_ODD_ROUTES)))
def test_a_page_decodes_exactly_as_decode_route_does(
    index: int, memory_kv: KvBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Column-wise where it can, key by key where it must: the rows are decode_route's."""
    items = list(dict([_ODD_ROUTES[0], _ODD_ROUTES[index]]).items())
    want = sorted(_expected(items), key=lambda r: str(r["region_id"]))
    key_by_key: list[str] = []
    decode_route = keys.decode_route

    def counted(key: str, value: bytes) -> RegionRoute | None:
        key_by_key.append(key)
        return decode_route(key, value)

    monkeypatch.setattr(keys, "decode_route", counted)
    memory_kv.batch_put(items)
    snap = read_snapshot(memory_kv, tmp_path / "map.parquet")
    got = pq.read_table(snap.map_path).to_pylist()
    assert sorted(got, key=lambda r: str(r["region_id"])) == want
    assert snap.malformed == len(items) - len(want)
    if index < 3:
        assert key_by_key == [], "a well-formed page takes the column-wise path"
    if index == 3:
        assert len(key_by_key) == len(items), "a page with a damaged value goes key by key"


def test_odd_keys_and_values_through_every_backend(any_kv: KvBackend, tmp_path: Path) -> None:
    any_kv.batch_put(_ODD_ROUTES)
    snap = read_snapshot(any_kv, tmp_path / "map.parquet")
    got = sorted(pq.read_table(snap.map_path).to_pylist(), key=lambda r: str(r["region_id"]))
    want = sorted(_expected(_ODD_ROUTES), key=lambda r: str(r["region_id"]))
    assert got == want
    assert snap.malformed == len(_ODD_ROUTES) - len(want) == 2
