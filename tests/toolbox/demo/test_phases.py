"""The demo's configs and its choice of where to trim, without services."""

from __future__ import annotations

from pathlib import Path

from metasrv.settings import load_settings
from toolbox.demo import DemoServices, TrimTarget, archiver_config, choose_trim, demo_config
from toolbox.stack import S3Endpoint

SERVICES = DemoServices(
    kafka_bootstrap="127.0.0.1:19092",
    etcd_endpoints=["127.0.0.1:12379"],
    postgres_url="postgresql+psycopg://metasrv:metasrv@127.0.0.1:15432/metasrv",
    s3=S3Endpoint("http://127.0.0.1:19000"),
)
TOKENS = {"datanode": "d" * 16, "operator": "o" * 16, "viewer": "v" * 16}


def test_metasrv_and_its_archiver_share_the_archive_but_not_the_port(tmp_path: Path) -> None:
    metasrv = tmp_path / "metasrv.toml"
    archiver = tmp_path / "archiver.toml"
    metasrv.write_text(demo_config(SERVICES, run_id="abc123", port=4000, tokens=TOKENS))
    archiver.write_text(archiver_config(SERVICES, run_id="abc123", port=4001))
    ours, theirs = load_settings(metasrv), load_settings(archiver)
    assert ours.wal.archive.enabled and theirs.wal.archive.enabled
    assert ours.wal.archive == theirs.wal.archive
    assert ours.wal.archive.prefix == "demo-abc123/"
    assert ours.wal.archive.consumer_group == "demo_abc123_archive"
    assert ours.wal.topic_name_prefix == theirs.wal.topic_name_prefix == "demo_abc123"
    assert (ours.http.addr, theirs.http.addr) == ("127.0.0.1:4000", "127.0.0.1:4001")


def test_the_trim_goes_to_the_archived_offset_past_the_region_that_loses_most() -> None:
    regions = [
        (0, 1, "t_0", [10, 11, 50]),  # 2 entries below t_0's archived 40
        (1, 2, "t_0", [5, 6, 7, 8]),  # 4 below
        (1, 3, "t_1", [1, 2, 3, 4, 5, 6]),  # t_1 archived nothing yet
        (0, 4, "t_2", []),
    ]
    target = choose_trim(regions, {"t_0": 40, "t_1": None, "t_2": 100})
    assert target == TrimTarget(node_id=1, region_id=2, topic="t_0", offset=40, need=5, cut=4)


def test_no_trim_when_no_region_needs_an_archived_entry() -> None:
    regions = [(0, 1, "t_0", [40, 41]), (0, 2, "t_1", [3])]
    assert choose_trim(regions, {"t_0": 40, "t_1": None}) is None
    assert choose_trim([], {"t_0": 40}) is None
