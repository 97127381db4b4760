"""A simulated datanode restores a region from the WAL archive (DESIGN §8, "Restore"): a real
`metasrv start` child with `[wal.archive]` on the stack's S3-compatible server, real Kafka.

The region never flushes, so it needs every entry it wrote; after a crash, an out-of-band
DeleteRecords trims its topic past that need. The entries below the trim were archived
first, so the restart replays them from the archive, then Kafka, and every acknowledged row
is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metasrv.archive import ObjectStore
from metasrv.errors import WalDataLoss
from metasrv.wire import MetasrvClient
from tests._archive import archive_config, archive_from_kafka, archive_settings, trim
from tests.toolbox.simulator._heartbeats import reported
from tests.toolbox.simulator._metasrv import DATANODE, OPERATOR, settings, start_metasrv
from toolbox.simulator import MetasrvProcess, SimDatanode, SimRegion, free_port
from toolbox.stack import S3Endpoint

REGION = (12 << 32) | 1
ROWS = 40
TRIM = 30


@pytest.fixture
def archived_metasrv(
    kafka_bootstrap: str,
    unique_prefix: str,
    tmp_path: Path,
    s3_endpoint: S3Endpoint,
    s3_prefix: str,
) -> Iterator[MetasrvProcess]:
    """A leader on SQLite with the ticker off and the archive enabled."""
    kv = {"backend": "sql", "sql_url": f"sqlite:///{tmp_path / 'kv.db'}"}
    sections = settings(
        unique_prefix, kafka_bootstrap, free_port(), kv, f"sqlite:///{tmp_path / 'h.db'}"
    )
    sections["wal.archive"] = archive_config(s3_endpoint, s3_prefix)
    proc = start_metasrv(tmp_path, "metasrv", sections)
    proc.start()
    yield proc
    proc.stop()


def _written(datanode: SimDatanode, url: str, topic: str) -> SimRegion:
    """Region `REGION` on `topic` with `ROWS` acknowledged rows, none flushed, reported."""
    with MetasrvClient(url, token=OPERATOR) as operator:
        operator.add_region(REGION, node_id=1, topic=topic)
    region = datanode.add_region(REGION, topic, flush_threshold_bytes=None)
    datanode.start()
    for future in [region.write("x" * 100) for _ in range(ROWS)]:
        future.result(30)
    reported(datanode)
    return region


def test_a_restart_below_the_log_start_replays_the_archive_then_kafka(
    archived_metasrv: MetasrvProcess,
    kafka_bootstrap: str,
    unique_prefix: str,
    tmp_path: Path,
    s3_endpoint: S3Endpoint,
    s3_prefix: str,
    archive_store: ObjectStore,
) -> None:
    topic = f"{unique_prefix}_0"
    datanode = SimDatanode(
        1,
        archived_metasrv.url,
        DATANODE,
        kafka_bootstrap,
        tmp_path / "dn",
        heartbeat_interval=0.3,
        archive=archive_settings(s3_endpoint, s3_prefix),
    )
    try:
        _written(datanode, archived_metasrv.url, topic)
        datanode.kill()
        archive_from_kafka(kafka_bootstrap, archive_store, topic, 0, TRIM)
        assert trim(kafka_bootstrap, topic, TRIM) == TRIM

        (report,) = datanode.restart(start=False)
        assert (report.start_entry_id, report.flushed_entry_id) == (0, -1)
        assert (report.records_read, report.from_archive, report.replayed) == (ROWS, TRIM, ROWS)
        (verified,) = datanode.verify()
        assert (verified.acknowledged, verified.missing) == (ROWS, 0)
    finally:
        datanode.close()


def test_without_the_archive_the_same_restart_is_data_loss(
    archived_metasrv: MetasrvProcess, kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    topic = f"{unique_prefix}_0"
    datanode = SimDatanode(
        1, archived_metasrv.url, DATANODE, kafka_bootstrap, tmp_path / "dn", heartbeat_interval=0.3
    )
    try:
        _written(datanode, archived_metasrv.url, topic)
        datanode.kill()
        assert trim(kafka_bootstrap, topic, TRIM) == TRIM
        # Nothing archived: metasrv names no objects, and the replay refuses to skip.
        with pytest.raises(WalDataLoss, match="does not hold"):
            datanode.restart(start=False)
    finally:
        datanode.close()
