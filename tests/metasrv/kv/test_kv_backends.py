"""Backend-specific behaviour: opening, schema creation, unreachable stores, the factory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, pool, text

from metasrv.errors import InvalidArgument, KvUnavailable, TxnTooLarge
from metasrv.kv import EtcdKv, KvBackend, Put, SqlKv, open_kv
from metasrv.settings import load_settings
from metasrv.sql import metadata
from tests.metasrv.kv._pgschema import fresh_schema


def test_a_prefix_range_ends_where_the_prefix_ends_at_the_edges_of_unicode(kv: KvBackend) -> None:
    # The range's end is the prefix with its last character raised by one: across the
    # surrogate gap (U+D7FF -> U+E000), carrying past U+10FFFF, open-ended when nothing is above.
    stored = ["a/", "a/x", "a0", "a\ud7ff", "a\ud7ffz", "a\ue000", "a\U0010ffff", "a\U0010ffffz"]
    stored += ["b", "\U0010ffff", "\U0010ffffq"]
    for key in stored:
        kv.put(key, b"v")
    in_byte_order = sorted(stored, key=str.encode)
    for prefix in ["a/", "a\ud7ff", "a\U0010ffff", "\U0010ffff", ""]:
        want = [key for key in in_byte_order if key.startswith(prefix)]
        assert [item.key for item in kv.range(prefix)] == want, ascii(prefix)
    assert kv.delete_prefix("a\U0010ffff") == 2
    assert kv.delete_prefix("\U0010ffff") == 2
    left = [key for key in in_byte_order if "\U0010ffff" not in key]
    assert [item.key for item in kv.range("")] == left


def test_sqlite_open_create_migrates_a_new_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    kv = SqlKv.open(url, create=True)
    try:
        assert kv.put("a", b"1") == 1
        assert set(inspect(kv.engine).get_table_names()) >= set(metadata.tables)
        with kv.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        kv.close()
    # reopening keeps the data
    again = SqlKv.open(url, create=True)
    try:
        assert again.get("a") is not None
    finally:
        again.close()


def test_sqlite_in_memory(tmp_path: Path) -> None:
    kv = SqlKv.open("sqlite://", create=True)
    try:
        kv.batch_put([(f"k/{i}", b"v") for i in range(10)])
        assert len(kv.range("k/")) == 10
    finally:
        kv.close()


def test_tables_from_create_all_work_without_the_revision_row(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    engine = create_engine(url, poolclass=pool.NullPool)
    metadata.create_all(engine)
    engine.dispose()
    kv = SqlKv(url)
    try:
        assert kv.put("a", b"1") == 1
        assert kv.put("b", b"1") == 2
    finally:
        kv.close()


def test_sqlite_without_schema_is_unavailable_with_a_hint(tmp_path: Path) -> None:
    kv = SqlKv(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        with pytest.raises(KvUnavailable, match="no such table"):
            kv.get("a")
    finally:
        kv.close()


def test_postgres_is_never_migrated_implicitly(postgres_url: str) -> None:
    with fresh_schema(postgres_url) as url:
        kv = SqlKv.open(url, create=True)
        try:
            with pytest.raises(KvUnavailable, match="metasrv db upgrade"):
                kv.put("a", b"1")
        finally:
            kv.close()
        engine = create_engine(url, poolclass=pool.NullPool)
        with engine.connect() as conn:
            assert inspect(conn).get_table_names() == []
            assert conn.execute(text("select current_schema()")).scalar() is not None
        engine.dispose()


def test_sql_key_too_long_is_rejected(tmp_path: Path) -> None:
    kv = SqlKv.open(f"sqlite:///{tmp_path / 'k.db'}", "p/", create=True)
    try:
        kv.put("k" * 1022, b"ok")
        with pytest.raises(InvalidArgument, match="at most 1024"):
            kv.put("k" * 1023, b"too long")
    finally:
        kv.close()


def test_unreachable_postgres_is_kv_unavailable() -> None:
    kv = SqlKv("postgresql://nobody:nothing@127.0.0.1:1/none?connect_timeout=2")
    try:
        with pytest.raises(KvUnavailable):
            kv.get("a")
        with pytest.raises(KvUnavailable):
            kv.txn([], [Put("a", b"1")])
    finally:
        kv.close()


def test_unreachable_etcd_is_kv_unavailable() -> None:
    kv = EtcdKv("127.0.0.1:1", timeout=2)
    try:
        started = time.monotonic()
        with pytest.raises(KvUnavailable):
            kv.get("a")
        with pytest.raises(KvUnavailable):
            kv.batch_put([("a", b"1")])
        assert time.monotonic() - started < 10
    finally:
        kv.close()


def test_closed_backend_is_unavailable(tmp_path: Path, etcd_endpoint: str) -> None:
    for kv in (SqlKv.open(f"sqlite:///{tmp_path / 'c.db'}", create=True), EtcdKv(etcd_endpoint)):
        kv.close()
        with pytest.raises(KvUnavailable, match="closed"):
            kv.get("a")


def test_etcd_batch_put_chunks_at_max_txn_ops(etcd_endpoint: str, unique_prefix: str) -> None:
    kv = EtcdKv(etcd_endpoint, f"{unique_prefix}/")
    try:
        assert kv.max_txn_ops == 128
        kv.batch_put([(f"r/{i:04d}", b"x" * 10) for i in range(129)])
        revs = {item.mod_revision for item in kv.scan("r/")}
        assert len(revs) == 2  # two transactions: 128 + 1 keys
        with pytest.raises(TxnTooLarge, match="at most 128"):
            kv.txn([], [Put(f"r/{i}", b"") for i in range(129)])
    finally:
        kv.delete_prefix("")
        kv.close()


def test_open_kv_from_settings(tmp_path: Path, etcd_endpoint: str, unique_prefix: str) -> None:
    sql = open_kv(load_settings(kv={"backend": "sql", "sql_url": f"sqlite:///{tmp_path / 'f.db'}"}))
    etcd = open_kv(
        load_settings(
            kv={"backend": "etcd", "etcd_endpoints": [etcd_endpoint], "key_prefix": unique_prefix}
        )
    )
    try:
        assert isinstance(sql, SqlKv)
        assert sql.put("a", b"1") > 0
        assert isinstance(etcd, EtcdKv)
        assert etcd.key_prefix == unique_prefix
        etcd.put("a", b"1")
        assert etcd.get("a") is not None
    finally:
        etcd.delete_prefix("")
        sql.close()
        etcd.close()
