"""Crash recovery of simulated regions against the real Kafka broker (no metasrv needed).

The replay start here is each region's own `flushed_entry_id + 1`, i.e. what the
metasrv answers before any purge; `test_heartbeat.py` covers the metasrv's answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metasrv.errors import WalDataLoss
from metasrv.kafka import KafkaAdmin
from toolbox.simulator import SimDatanode, SimRegion

R1, R2, R3 = (1 << 32) | 1, (1 << 32) | 2, (1 << 32) | 3


def from_flushed(datanode: SimDatanode) -> Callable[[int], int]:
    """Replay start = flushed entry id + 1, read from the region's manifest on disk."""

    def start(region_id: int) -> int:
        manifest = SimRegion.stored_manifest(datanode.data_dir / f"region_{region_id}")
        assert manifest is not None
        return manifest.flushed_entry_id + 1

    return start


def write(region: SimRegion, n: int, tag: str) -> list[int]:
    """Write n rows and wait for every acknowledgement; return their entry ids."""
    futures = [region.write(f"{tag}-{i}") for i in range(n)]
    return [f.result(timeout=30) for f in futures]


@pytest.fixture
def datanode(kafka_bootstrap: str, tmp_path: Path) -> Iterator[SimDatanode]:
    """A datanode without a metasrv whose regions flush only when told."""
    node = SimDatanode(0, None, None, kafka_bootstrap, tmp_path / "dn0", flush_threshold_bytes=None)
    yield node
    node.close()


def test_kill_and_restart_recovers_every_acknowledged_row(
    datanode: SimDatanode, kafka_topic: str
) -> None:
    r1 = datanode.add_region(R1, kafka_topic)
    r2 = datanode.add_region(R2, kafka_topic)
    datanode.start()
    first = write(r1, 60, "a") + write(r2, 40, "b")
    assert r1.flush() == max(first[:60])
    write(r1, 30, "c")
    write(r2, 20, "d")

    datanode.kill()
    reports = {r.region_id: r for r in datanode.restart(from_flushed(datanode))}
    verified = {v.region_id: v for v in datanode.verify()}

    assert reports[R1].start_entry_id == max(first[:60]) + 1
    assert reports[R1].replayed == 30
    assert reports[R2].start_entry_id == 0
    assert reports[R2].replayed == 60
    assert (verified[R1].acknowledged, verified[R1].recovered_from_sst) == (90, 60)
    assert verified[R1].recovered_from_memtable == 30
    assert (verified[R2].acknowledged, verified[R2].recovered_from_sst) == (60, 0)
    assert all(v.missing == 0 for v in verified.values())

    # The restarted region keeps going: new rows, a flush, a second crash, all still there.
    r1 = datanode.regions[R1]
    write(r1, 10, "e")
    r1.flush()
    datanode.kill()
    datanode.restart(from_flushed(datanode))
    again = {v.region_id: v for v in datanode.verify()}
    r1_again = (again[R1].acknowledged, again[R1].recovered_from_sst, again[R1].missing)
    assert r1_again == (100, 100, 0)
    assert (again[R2].acknowledged, again[R2].missing) == (60, 0)


def test_verify_reports_rows_a_short_replay_skipped(
    datanode: SimDatanode, kafka_topic: str, kafka_admin: KafkaAdmin
) -> None:
    """Control: a replay that starts too late leaves acknowledged rows missing, and says so."""
    r1 = datanode.add_region(R1, kafka_topic)
    datanode.start()
    ids = write(r1, 25, "a")
    r1.flush()
    write(r1, 15, "b")
    datanode.kill()
    end = kafka_admin.offsets([kafka_topic])[kafka_topic].high_watermark
    datanode.restart(lambda _region_id: end - 5)

    (report,) = datanode.verify()
    assert report.acknowledged == 40
    assert report.recovered_from_sst == 25
    assert report.missing == 10
    assert report.missing_entry_ids[0] == max(ids) + 1
    assert not report.ok


def test_replay_below_log_start_fails_loudly(
    datanode: SimDatanode, kafka_topic: str, kafka_admin: KafkaAdmin
) -> None:
    r1 = datanode.add_region(R1, kafka_topic)
    datanode.start()
    write(r1, 50, "a")  # never flushed: the region needs entries 0..49 from the WAL
    datanode.kill()
    assert kafka_admin.delete_records({kafka_topic: 30}) == {kafka_topic: 30}

    with pytest.raises(WalDataLoss) as raised:
        datanode.restart(from_flushed(datanode))
    assert raised.value.details["region_id"] == R1
    assert raised.value.details["start_entry_id"] == 0
    assert raised.value.details["kafka_error"] in ("_AUTO_OFFSET_RESET", "OFFSET_OUT_OF_RANGE")

    # Replaying from inside the log works, and the 30 deleted rows show up as missing.
    datanode.restart(lambda _region_id: 30)
    (report,) = datanode.verify()
    assert (report.acknowledged, report.replayed, report.missing) == (50, 20, 30)


def test_idle_region_reports_topic_latest_entry_id(datanode: SimDatanode, kafka_topic: str) -> None:
    busy = datanode.add_region(R1, kafka_topic)
    idle = datanode.add_region(R2, kafka_topic)
    datanode.start()
    ids = write(busy, 20, "a")

    payload = datanode.heartbeat_payload()
    stats = {r["region_id"]: r for r in payload["regions"]}
    assert stats[R2]["topic_latest_entry_id"] == max(ids)
    assert stats[R2]["flushed_entry_id"] == -1
    assert stats[R2]["memtable_bytes"] == 0
    assert stats[R1]["topic_latest_entry_id"] is None  # unflushed rows: it must not claim more
    assert stats[R1]["memtable_bytes"] > 0
    assert payload["topics"] == [
        {
            "topic": kafka_topic,
            "latest_entry_id": max(ids),
            "record_size": payload["topics"][0]["record_size"],
            "record_num": 20,
        }
    ]
    assert payload["topics"][0]["record_size"] > 20 * 20

    busy.flush()
    more = write(datanode.add_region(R3, kafka_topic), 5, "c")
    stats = {r["region_id"]: r for r in datanode.heartbeat_payload()["regions"]}
    assert stats[R1]["flushed_entry_id"] == max(ids)
    assert stats[R1]["topic_latest_entry_id"] == max(more)  # flushed and idle: follows the topic
    assert stats[R2]["topic_latest_entry_id"] == max(more)
    assert stats[R3]["topic_latest_entry_id"] is None

    (first,) = write(idle, 1, "d")  # a write ends idleness at once ...
    assert idle.stat().topic_latest_entry_id is None
    # ... after making what it reported durable: everything of it up to there is flushed.
    assert idle.stat().flushed_entry_id == max(more) < first
    manifest = SimRegion.stored_manifest(datanode.data_dir / f"region_{R2}")
    assert manifest is not None and manifest.flushed_entry_id == max(more)


def test_a_replay_start_below_kafkas_log_start_is_loss_said_at_once(
    datanode: SimDatanode, kafka_topic: str, kafka_admin: KafkaAdmin
) -> None:
    """The datanode replays from the start it is given, or from its own flushed id + 1 when
    that is higher, once: an answer below Kafka's log start that is below its flushed id
    too reads nothing it needs from there and recovers every row; a start the region needs
    below the log start fails loudly (metasrv never gives one to a region that needs
    nothing below it)."""
    r1 = datanode.add_region(R1, kafka_topic)
    datanode.start()
    write(r1, 30, "a")
    flushed = r1.flush()
    assert flushed == 29
    write(r1, 10, "b")  # entries 30..39, needed from the WAL
    datanode.kill()
    assert kafka_admin.delete_records({kafka_topic: 25}) == {kafka_topic: 25}
    (report,) = datanode.restart(lambda _region_id: 20)
    assert report.start_entry_id == flushed + 1
    (verified,) = datanode.verify()
    assert (verified.acknowledged, verified.missing) == (40, 0)

    datanode.kill()
    assert kafka_admin.delete_records({kafka_topic: 35}) == {kafka_topic: 35}
    asked: list[int] = []

    def below(region_id: int) -> int:
        asked.append(region_id)
        return 20

    with pytest.raises(WalDataLoss):
        datanode.restart(below)  # entries 30..34, which it needs, are gone
    assert asked == [R1]
