"""SIGKILL a real leader process after each persisted purge step; a new leader resumes.

The child (tests/procedures/_runner.py) freezes right after the chosen write commits,
so each kill point is exact. The new leader starts with an empty registry, as after any
leader change; the tests check what it may and may not do before regions report again,
the final state, and that every entry a region needs is still readable with
`auto.offset.reset=error`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import EtcdKv, Put
from procedures import ProcedureState
from tests._wait import eventually, wait_until
from tests.procedures._harness import Harness, make_settings, produce

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]
TOPIC_N = 0
RECORDS = 100
# Region 1 needs entries > 70, region 2 entries > 40: P = 40.
REGIONS = [
    {"region_id": 1, "node_id": 1, "flushed": 70},
    {"region_id": 2, "node_id": 2, "flushed": 40},
]


@dataclass
class World:
    """One test's topic, kv prefix and history database, shared by runner and resumer."""

    kafka: str
    etcd: str
    prefix: str
    history_url: str
    tmp: Path

    @property
    def topic(self) -> str:
        return f"{self.prefix}_{TOPIC_N}"

    def settings(self, **wal: Any) -> Any:
        return make_settings(kafka=self.kafka, etcd=self.etcd, prefix=self.prefix, wal=wal)


@pytest.fixture
async def world(
    kafka_bootstrap: str, etcd_endpoint: str, unique_prefix: str, history_url: str, tmp_path: Path
) -> AsyncIterator[World]:
    w = World(kafka_bootstrap, etcd_endpoint, unique_prefix, history_url, tmp_path)
    admin = KafkaAdmin(kafka_bootstrap)
    admin.ensure_topics([w.topic])
    produce(kafka_bootstrap, w.topic, RECORDS)
    kv = EtcdKv([etcd_endpoint], f"{unique_prefix}/")
    for r in REGIONS:
        key = keys.topic_region(w.topic, int(r["region_id"]))
        kv.txn([], [Put(key, keys.encode_route(int(r["node_id"]), None))])
    try:
        yield w
    finally:
        kv.delete_prefix("")
        kv.close()
        admin.delete_topics([w.topic])


def kill_runner_at(w: World, point: str, **spec: Any) -> None:
    """Run the child until it freezes at `point`, then SIGKILL it."""
    signal_file = w.tmp / f"{point}.signal"
    spec_file = w.tmp / f"{point}.json"
    spec_file.write_bytes(
        orjson.dumps(
            {
                "kafka": w.kafka,
                "etcd": w.etcd,
                "prefix": w.prefix,
                "history_url": w.history_url,
                "topic": w.topic,
                "kill_point": point,
                "signal_file": str(signal_file),
                "regions": REGIONS,
                **spec,
            }
        )
    )
    log = (w.tmp / f"{point}.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.procedures._runner", str(spec_file)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def stopped_at_point() -> bool:
            if child.poll() is not None:
                raise AssertionError(
                    f"runner exited before {point}: " + (w.tmp / f"{point}.log").read_text()[-3000:]
                )
            return signal_file.exists()

        wait_until(stopped_at_point, f"the runner at {point}", timeout=90, interval=0.05)
        reached = json.loads(signal_file.read_text())
        assert reached["point"] == point, reached
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        log.close()


async def resume(w: World, **wal: Any) -> Harness:
    """A new leader process-equivalent: fresh registry, same kv and history."""
    h = Harness(w.settings(**wal), w.history_url, name="resumer")
    await h.start(wait_leader=60)
    return h


def stored_marker(w: World) -> int | None:
    kv = EtcdKv([w.etcd], f"{w.prefix}/")
    try:
        stored = kv.get(keys.topic_name(w.topic))
        return None if stored is None else keys.decode_marker(stored.value).pruned_entry_id
    finally:
        kv.close()


def lock_holder(w: World) -> str:
    """The crashed purge's id, from the topic's kv lock (read before anyone resumes)."""
    kv = EtcdKv([w.etcd], f"{w.prefix}/")
    try:
        lock = kv.get(keys.lock(w.topic))
    finally:
        kv.close()
    assert lock is not None, "the purge's topic lock should survive the crash"
    return str(orjson.loads(lock.value)["procedure_id"])


def report_all(h: Harness, topic: str, regions: list[dict[str, int]] = REGIONS) -> None:
    for r in regions:
        h.report(r["region_id"], topic, r["flushed"], node_id=r["node_id"])


def assert_needed_entries_readable(h: Harness, topic: str, regions: list[dict[str, int]]) -> None:
    for r in regions:
        assert h.readable(topic, r["flushed"] + 1), f"region {r['region_id']} lost entries"


async def assert_waits_without_deleting(h: Harness, pid: str, topic: str) -> None:
    """With an empty registry the resumed purge must not delete (invariant 3): it runs its
    step, finds no stats, and retries; nothing is deleted meanwhile."""

    async def refused_for_want_of_stats() -> bool:
        view = await h.manager.get(pid)
        assert not view.state.terminal, view
        assert h.offsets(topic).log_start_offset == 0
        return view.state is ProcedureState.RETRYING and "no_stat" in (view.error or "")

    await eventually(refused_for_want_of_stats, "the resumed purge refused for want of stats")
    view = await h.manager.get(pid)
    assert view.error_code == "unavailable", view
    assert h.offsets(topic).log_start_offset == 0


async def test_killed_after_prepare_resumes_only_after_regions_report(world: World) -> None:
    kill_runner_at(world, "after_prepare")
    pid = lock_holder(world)
    h = await resume(world)
    try:
        await assert_waits_without_deleting(h, pid, world.topic)
        report_all(h, world.topic)
        view = await h.manager.wait(pid, 60)
        assert view.state is ProcedureState.SUCCEEDED, view
        assert h.offsets(world.topic).log_start_offset == 40
        assert h.marker(world.topic) == 40
        assert_needed_entries_readable(h, world.topic, REGIONS)
        assert not h.readable(world.topic, 39)
    finally:
        await h.close()


async def test_killed_after_flush_sent_waits_for_reports_then_purges_further(
    world: World,
) -> None:
    flushy = {"flush_trigger_size": "1KB", "flush_wait_timeout": "30s"}
    kill_runner_at(
        world,
        "after_flush_sent",
        wal=flushy,
        topic_stat={"latest": RECORDS - 1, "record_size": 100 * RECORDS, "record_num": RECORDS},
    )
    pid = lock_holder(world)
    h = await resume(world, **flushy)
    try:
        view = await h.manager.get(pid)
        assert view.step == "flush" and view.data["flush_sent_at"] is not None
        # The flush was sent by the dead leader; region 2 flushes and reports to the new one.
        flushed = [{**REGIONS[0], "flushed": 90}, {**REGIONS[1], "flushed": 80}]
        report_all(h, world.topic, flushed)
        view = await h.manager.wait(pid, 60)
        assert view.state is ProcedureState.SUCCEEDED, view
        assert h.offsets(world.topic).log_start_offset == 80
        assert h.marker(world.topic) == 80
        assert_needed_entries_readable(h, world.topic, flushed)
    finally:
        await h.close()


async def test_killed_after_intent_lowers_target_for_region_registered_meanwhile(
    world: World,
) -> None:
    kill_runner_at(world, "after_intent")
    # Between the crash and the resume, region 3 is mapped to the topic, needing 21..
    kv = EtcdKv([world.etcd], f"{world.prefix}/")
    kv.txn([], [Put(keys.topic_region(world.topic, 3), keys.encode_route(3, None))])
    kv.close()
    pid = lock_holder(world)
    h = await resume(world)
    try:
        view = await h.manager.get(pid)
        assert view.step == "purge" and view.data["target"] == 40
        await assert_waits_without_deleting(h, pid, world.topic)
        regions = [*REGIONS, {"region_id": 3, "node_id": 3, "flushed": 20}]
        report_all(h, world.topic, regions)
        view = await h.manager.wait(pid, 60)
        assert view.state is ProcedureState.SUCCEEDED, view
        assert view.data["target"] == 20
        assert h.offsets(world.topic).log_start_offset == 20
        assert h.marker(world.topic) == 20
        assert_needed_entries_readable(h, world.topic, regions)
    finally:
        await h.close()


async def test_killed_after_marker_deletes_without_stats(world: World) -> None:
    kill_runner_at(world, "after_marker")
    # Marker first: the dead leader moved it, Kafka still holds everything.
    assert stored_marker(world) == 40
    assert KafkaAdmin(world.kafka).offsets([world.topic])[world.topic].log_start_offset == 0
    pid = lock_holder(world)
    h = await resume(world)
    try:
        # No region has reported: nobody replays below the marker, so deleting up to it
        # needs no stats, and replay-start was never below Kafka's log start.
        view = await h.manager.wait(pid, 60)
        assert view.state is ProcedureState.SUCCEEDED, view
        assert h.marker(world.topic) == 40
        assert h.offsets(world.topic).log_start_offset == 40
        [row] = await h.manager.services.history.purges(topic=world.topic)
        assert (row.procedure_id, row.prune_point, row.low_watermark) == (pid, 40, 40)
        assert row.entries_deleted == 40
        assert_needed_entries_readable(h, world.topic, REGIONS)
        assert not h.readable(world.topic, 39)
    finally:
        await h.close()


async def test_killed_after_delete_records_writes_history_once(world: World) -> None:
    kill_runner_at(world, "after_delete")
    assert stored_marker(world) == 40
    assert KafkaAdmin(world.kafka).offsets([world.topic])[world.topic].log_start_offset == 40
    pid = lock_holder(world)
    h = await resume(world)
    try:
        view = await h.manager.wait(pid, 60)
        assert view.state is ProcedureState.SUCCEEDED, view
        assert h.marker(world.topic) == 40
        assert await h.manager.services.history.purge_count(topic=world.topic) == 1
        assert h.kv.get(keys.lock(world.topic)) is None
        assert_needed_entries_readable(h, world.topic, REGIONS)
        assert not h.readable(world.topic, 39)
    finally:
        await h.close()
