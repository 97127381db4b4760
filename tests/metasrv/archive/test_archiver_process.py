"""`metasrv archive -c FILE` as a real process against the real Kafka and S3-compatible server:
killed (SIGKILL) between its put and its verification, or between its verification and its
commit, then restarted: no gap. Two archivers share the pool through the group, and a kill of
one moves its topics to the other: no gap. SIGTERM leaves the group and exits 0. It refuses to
start with the archive disabled or the store unreachable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from metasrv.archive import ObjectStore, PausePoint, WalRecord
from metasrv.kafka import KafkaAdmin
from tests._wait import wait_until
from tests.metasrv.archive._wal import Pool, archived_entries, committed, produce, ranges
from toolbox.simulator import free_port, log_records, metasrv_argv

PAUSE_ENV = "METASRV_ARCHIVER_PAUSE_AT"


class ArchiverProcess:
    """One `metasrv archive -c FILE` child; its JSON-line log goes to `log`."""

    def __init__(self, pool: Pool, tmp: Path, name: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.log = tmp / f"{name}.log"
        config = pool.write_config(tmp / f"{name}.toml", f"127.0.0.1:{self.port}")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                metasrv_argv("archive", "-c", str(config), "--store-wait", "10"),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )

    def get(self, path: str) -> tuple[int, bytes] | None:
        """(status, body) of GET `path` on its HTTP server; None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return None

    def readyz(self) -> dict[str, Any] | None:
        answer = self.get("/readyz")
        return json.loads(answer[1]) if answer else None

    def assigned(self) -> set[str] | None:
        """Its topics once ready, else None."""
        state = self.readyz()
        return set(state["assigned"]) if state and state["ready"] else None

    def logged(self, msg: str) -> list[dict[str, Any]]:
        return [record for _, record in log_records(self.log, msg)]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def pool_size() -> int:
    return 4


@pytest.fixture
def archivers(pool: Pool, tmp_path: Path) -> Iterator[list[ArchiverProcess]]:
    started: list[ArchiverProcess] = []
    yield started
    for archiver in started:
        if archiver.proc.poll() is None:
            archiver.kill()


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
    archivers: list[ArchiverProcess],
    tmp_path: Path,
    point: PausePoint,
) -> None:
    topic = pool.topics[0]
    produced = {topic: produce(pool.bootstrap, topic, 5)}
    first = ArchiverProcess(pool, tmp_path, "first", {PAUSE_ENV: point.value})
    archivers.append(first)
    [paused] = wait_until(lambda: first.logged("paused (test hook)"), f"a pause at {point}")
    assert paused["point"] == point.value and paused["topic"] == topic
    assert [r.key(pool.s3_prefix) for r in ranges(store, topic)] == [paused["key"]]
    assert committed(kafka_admin, pool.group, [topic]) == {topic: None}
    first.kill()
    assert committed(kafka_admin, pool.group, [topic]) == {topic: None}

    produced[topic] += produce(pool.bootstrap, topic, 5, start=5)
    archivers.append(ArchiverProcess(pool, tmp_path, "second"))
    wait_until(lambda: _all_committed(kafka_admin, pool, produced), "the restart's commits")
    _check_archive(store, produced)


def test_two_archivers_split_the_pool_and_a_killed_ones_topics_go_to_the_other(
    pool: Pool,
    store: ObjectStore,
    kafka_admin: KafkaAdmin,
    archivers: list[ArchiverProcess],
    tmp_path: Path,
) -> None:
    a = ArchiverProcess(pool, tmp_path, "a")
    b = ArchiverProcess(pool, tmp_path, "b")
    archivers += [a, b]

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
    scraped = a.get("/metrics")
    assert scraped is not None and scraped[0] == 200
    assert {t for t, line in written.items() if line in scraped[1].decode()} == a_topics

    a.kill()
    for topic in pool.topics:
        produced[topic] += produce(pool.bootstrap, topic, 3, start=4)
    wait_until(lambda: b.assigned() == set(pool.topics), "b to take a's topics")
    wait_until(lambda: _all_committed(kafka_admin, pool, produced), "commits after the kill")
    _check_archive(store, produced)


def test_sigterm_leaves_the_group_and_exits_0(
    pool: Pool,
    store: ObjectStore,
    kafka_admin: KafkaAdmin,
    archivers: list[ArchiverProcess],
    tmp_path: Path,
) -> None:
    produced = {t: produce(pool.bootstrap, t, 3) for t in pool.topics[:2]}
    archiver = ArchiverProcess(pool, tmp_path, "only")
    archivers.append(archiver)
    wait_until(lambda: _all_committed(kafka_admin, pool, produced), "the commits")
    assert archiver.stop() == 0
    assert archiver.logged("archiver stopped")
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
