"""Where the stat history lives: per cluster, independent of the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from metasrv.errors import ConfigError
from metasrv.settings import load_settings
from metasrv.stat_history import (
    STATS_DIR,
    StatHistoryWriter,
    cluster_root,
    hour_partition,
    open_location,
    path_slug,
    spark_location,
    writer_partition,
)
from tests.metasrv.reconcile._seed import NOW, stat


def test_slugs_are_path_safe_and_keep_distinct_texts_apart() -> None:
    names = ["", "a/b", "a_b", "127.0.0.1:4000", "t1234abcd/", "x=y"]
    slugs = [path_slug(n) for n in names]
    assert len(set(slugs)) == len(names)
    for slug in slugs:
        assert all(c.isalnum() or c in "._-" for c in slug), slug
    assert path_slug("a/b") == path_slug("a/b")
    assert writer_partition("127.0.0.1:4000").startswith("writer=127.0.0.1_4000-")


def test_a_relative_stats_url_is_refused() -> None:
    with pytest.raises(ConfigError, match="stats_url 'hist' is relative"):
        load_settings(history={"stats_url": "hist"})
    assert load_settings(history={"stats_url": "s3://bucket/h"}).history.stats_url


def test_clusters_sharing_a_location_get_their_own_directories(tmp_path: Path) -> None:
    base = {"stats_url": str(tmp_path)}
    a = load_settings(history=base, kv={"backend": "etcd", "key_prefix": "a/"})
    b = load_settings(history=base, kv={"backend": "etcd", "key_prefix": "b/"})
    assert cluster_root(a) != cluster_root(b)
    assert cluster_root(a).startswith(f"{tmp_path}/cluster=a-")
    # The CLI's --history replaces the base, not the cluster part.
    assert cluster_root(a, "s3://bkt/x").startswith("s3://bkt/x/cluster=a-")


def test_the_default_follows_the_sqlite_kv_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    kv = {"backend": "sql", "sql_url": f"sqlite:///{one / 'kv.db'}"}
    roots = []
    for cwd in (one, two):
        monkeypatch.chdir(cwd)
        roots.append(cluster_root(load_settings(kv=kv)))
    # Same cluster (same kv file) from two working directories: one history.
    assert roots[0] == roots[1]
    assert roots[0].startswith(f"{one}/metasrv-stat-history/cluster=")
    # The relative default kv file is another cluster in each directory, and so is its history.
    relative = []
    for cwd in (one, two):
        monkeypatch.chdir(cwd)
        relative.append(cluster_root(load_settings()))
    assert relative[0].startswith(f"{one}/") and relative[1].startswith(f"{two}/")


def test_the_default_for_etcd_is_the_users_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    root = cluster_root(load_settings(kv={"backend": "etcd", "key_prefix": "p/"}))
    assert root.startswith(f"{tmp_path}/state/metasrv/stat-history/cluster=p-")
    assert os.path.isabs(root)


def test_spark_reads_s3_through_s3a() -> None:
    assert spark_location("s3://b/h") == "s3a://b/h"
    assert spark_location("/data/h") == "file:///data/h"
    assert spark_location("hdfs://nn/h") == "hdfs://nn/h"
    fs, path = open_location(str(Path("/tmp")))
    assert fs.type_name == "local" and path == "/tmp"


def test_two_writers_share_one_history_and_either_prunes_old_hours(tmp_path: Path) -> None:
    root = str(tmp_path / "cluster=x")
    first = StatHistoryWriter(root, 60.0, retention=3600.0, writer="ms-a:4000")
    second = StatHistoryWriter(root, 60.0, retention=3600.0, writer="ms-b:4000")
    first.write_snapshot({1: stat(1, "t", NOW - 1)}, now=NOW, mono_now=NOW)
    second.write_snapshot({2: stat(2, "t", NOW + 59)}, now=NOW + 60, mono_now=NOW + 60)
    table = ds.dataset(f"{root}/{STATS_DIR}", format="parquet", partitioning="hive").to_table()
    got = {(r["region_id"], r["writer"]) for r in table.to_pylist()}
    assert got == {(1, writer_partition("ms-a:4000")[7:]), (2, writer_partition("ms-b:4000")[7:])}
    # Two hours later the second leader's write removes both leaders' old hour.
    later = NOW + 2 * 3600 + 60
    second.write_snapshot({2: stat(2, "t", later)}, now=later, mono_now=later)
    hours = {p.name for p in (tmp_path / "cluster=x" / STATS_DIR).iterdir()}
    assert hours == {f"hour={hour_partition(later)}"}
