"""`metasrv archive -c FILE` as a real process against the real Kafka and S3-compatible server:
killed (SIGKILL) between its put and its verification, or between its verification and its
commit, then restarted: no gap. Two archivers share the pool through the group, and a kill of
one moves its topics to the other: no gap. SIGTERM leaves the group and exits 0. It refuses to
start with the archive disabled or the store unreachable."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from metasrv.archive import ObjectStore, PausePoint, WalRecord
from metasrv.kafka import KafkaAdmin
from tests._wait import wait_until
from tests.metasrv.archive._wal import Pool, archived_entries, committed, produce, ranges
from toolbox.simulator import ArchiverProcess, free_port, metasrv_argv

PAUSE_ENV = "METASRV_ARCHIVER_PAUSE_AT"


StartArchiver = Callable[..., ArchiverProcess]


@pytest.fixture
def pool_size() -> int:
    return 4


@pytest.fixture
def start_archiver(pool: Pool, tmp_path: Path) -> Iterator[StartArchiver]:
    """Spawns `metasrv archive -c FILE` on the pool (`name`, `env` over this process's);
    SIGKILLs whichever still run after the test."""
    started: list[ArchiverProcess] = []

    def start(name: str, env: dict[str, str] | None = None) -> ArchiverProcess:
        url = f"http://127.0.0.1:{free_port()}"
        config = pool.write_config(tmp_path / f"{name}.toml", url.removeprefix("http://"))
        archiver = ArchiverProcess(
            config, tmp_path / f"{name}.log", url, args=("--store-wait", "10"), env=env
        )
        started.append(archiver)
        archiver.spawn()
        return archiver

    yield start
    for archiver in started:
        archiver.kill()


def _logged(archiver: ArchiverProcess, msg: str) -> list[dict[str, Any]]:
    return [record for _, record in archiver.log_records(msg)]


def _all_committed(admin: KafkaAdmin, pool: Pool, produced: dict[str, list[WalRecord]]) -> bool:
    ends = {t: records[-1].entry_id + 1 for t, records in produced.items()}
    return committed(admin, pool.group, list(ends)) == ends


def _check_archive(store: ObjectStore, produced: dict[str, list[WalRecord]]) -> None:
    for topic, records in produced.items():
        assert archived_entries(store, topic, records[-1].entry_id + 1) == records


@pytest.mark.parametrize("point", list(PausePoint))
def test_an_archiver_killed_before_its_commit_leaves_no_gap_once_restarted(
    pool: Pool,
    store: ObjectStore,
    kafka_admin: KafkaAdmin,
    start_archiver: StartArchiver,
    point: PausePoint,
) -> None:
    topic = pool.topics[0]
    produced = {topic: produce(pool.bootstrap, topic, 5)}
    first = start_archiver("first", {PAUSE_ENV: point.value})
    [paused] = wait_until(lambda: _logged(first, "paused (test hook)"), f"a pause at {point}")
    assert paused["point"] == point.value and paused["topic"] == topic
    assert [r.key(pool.s3_prefix) for r in ranges(store, topic)] == [paused["key"]]
    assert committed(kafka_admin, pool.group, [topic]) == {topic: None}
    first.kill()
    assert committed(kafka_admin, pool.group, [topic]) == {topic: None}

    produced[topic] += produce(pool.bootstrap, topic, 5, start=5)
    start_archiver("second")
    wait_until(lambda: _all_committed(kafka_admin, pool, produced), "the restart's commits")
    _check_archive(store, produced)


def test_two_archivers_split_the_pool_and_a_killed_ones_topics_go_to_the_other(
    pool: Pool, store: ObjectStore, kafka_admin: KafkaAdmin, start_archiver: StartArchiver
) -> None:
    a, b = start_archiver("a"), start_archiver("b")

    def split() -> tuple[set[str], set[str]] | None:
        mine, theirs = a.assigned(), b.assigned()
        if mine and theirs and not mine & theirs and mine | theirs == set(pool.topics):
            return mine, theirs
        return None

    a_topics, _ = wait_until(split, "both archivers to hold part of the pool")
    produced = {t: produce(pool.bootstrap, t, 4) for t in pool.topics}
    wait_until(lambda: _all_committed(kafka_admin, pool, produced), "every topic's commit")
    # Each wrote the objects of its own topics.
    written = {t: f'metasrv_archiver_written_objects_total{{topic="{t}"}}' for t in pool.topics}
    scraped = httpx.get(f"{a.url}/metrics", timeout=5)
    assert scraped.status_code == 200
    assert {t for t, line in written.items() if line in scraped.text} == a_topics

    a.kill()
    for topic in pool.topics:
        produced[topic] += produce(pool.bootstrap, topic, 3, start=4)
    wait_until(lambda: b.assigned() == set(pool.topics), "b to take a's topics")
    wait_until(lambda: _all_committed(kafka_admin, pool, produced), "commits after the kill")
    _check_archive(store, produced)


def test_sigterm_leaves_the_group_and_exits_0(
    pool: Pool, store: ObjectStore, kafka_admin: KafkaAdmin, start_archiver: StartArchiver
) -> None:
    produced = {t: produce(pool.bootstrap, t, 3) for t in pool.topics[:2]}
    archiver = start_archiver("only")
    wait_until(lambda: _all_committed(kafka_admin, pool, produced), "the commits")
    assert archiver.stop() == 0
    assert _logged(archiver, "archiver stopped")
    admin = AdminClient({"bootstrap.servers": pool.bootstrap})
    group = admin.describe_consumer_groups([pool.group])[pool.group].result(10)
    assert group.members == []  # no member left behind to wait out a session timeout
    _check_archive(store, produced)


def test_it_refuses_to_start_with_the_archive_disabled_or_the_store_unreachable(
    pool: Pool, tmp_path: Path
) -> None:
    disabled = pool.write_config(tmp_path / "off.toml", "127.0.0.1:0", enabled=False)
    done = subprocess.run(
        metasrv_argv("archive", "-c", str(disabled)), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "[wal.archive] enabled is false" in done.stderr

    closed = f"http://127.0.0.1:{free_port()}"
    unreachable = pool.write_config(tmp_path / "down.toml", "127.0.0.1:0", endpoint=closed)
    done = subprocess.run(
        metasrv_argv("archive", "-c", str(unreachable), "--store-wait", "1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "cannot start" in done.stderr and "object store" in done.stderr
