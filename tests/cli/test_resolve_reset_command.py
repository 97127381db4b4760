"""`metasrv topic resolve-reset TOPIC --topic-id ID` against a live metasrv (real etcd and
Kafka): a wrong id is a conflict (exit 5) and changes nothing, the right one resolves the
reset, and a second run finds nothing latched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cli import Exit, app, why_not_purged
from metasrv import keys, wire
from metasrv.kafka import KafkaAdmin
from metasrv.keys import Marker, ResetLatch
from metasrv.kv import EtcdKv
from tests.api._live import OPERATOR_TOKEN, VIEWER_TOKEN, LiveMetasrv, live_metasrv
from tests.metasrv.kafka._recreate import topic_id

runner = CliRunner()


def test_status_says_a_topic_reset_first() -> None:
    plan = wire.TopicPlan(
        topic="wal_0",
        prune_point=None,
        pruned_entry_id=60,
        log_start_offset=0,
        high_watermark=30,
        blocked_by=[wire.BlockingRegion(region_id=1, reason=wire.BlockReason.TOPIC_RESET)],
        reclaimable_entries=0,
        data_loss=[],
        region_count=1,
        topic_reset="high_watermark_below_marker: high watermark 30 is below 61",
    )
    assert why_not_purged(plan) == (
        "TOPIC RESET (WAL data loss; resolve-reset once rebuilt): "
        "high_watermark_below_marker: high watermark 30 is below 61"
    )


@pytest.fixture
def metasrv(kafka_bootstrap: str, etcd_endpoint: str, tmp_path: Path) -> Iterator[LiveMetasrv]:
    with live_metasrv(kafka_bootstrap, etcd_endpoint, tmp_path) as served:
        yield served


def _run(url: str, *args: str, token: str = OPERATOR_TOKEN) -> Result:
    env = {"COLUMNS": "250", "METASRV_TOKEN": token}
    return runner.invoke(app, [*args, "--url", url], env=env)


def test_resolve_reset_command(
    metasrv: LiveMetasrv, kafka_bootstrap: str, etcd_endpoint: str
) -> None:
    topic = metasrv.world.blocked_topic
    kv = EtcdKv(etcd_endpoint, f"/{metasrv.prefix}/")
    try:
        latched = Marker(7, "oldid", ResetLatch("high_watermark_below_marker", None, 3))
        kv.put(keys.topic_name(topic), keys.encode_marker(latched))
        current = topic_id(KafkaAdmin(kafka_bootstrap), topic)

        wrong = _run(metasrv.url, "topic", "resolve-reset", topic, "--topic-id", "nope")
        assert wrong.exit_code == Exit.CONFLICT, wrong.output
        assert current in wrong.output  # the error names Kafka's id now
        viewer = _run(
            metasrv.url, "topic", "resolve-reset", topic, "--topic-id", current, token=VIEWER_TOKEN
        )
        assert viewer.exit_code == Exit.UNREACHABLE and "permission_denied" in viewer.output
        stored = kv.get(keys.topic_name(topic))
        assert stored is not None and keys.decode_marker(stored.value) == latched

        done = _run(metasrv.url, "topic", "resolve-reset", topic, "--topic-id", current)
        assert done.exit_code == 0, done.output
        assert f"topic {topic}: reset resolved (high_watermark_below_marker)" in done.stdout
        assert "1 region(s) must report again" in done.stdout
        stored = kv.get(keys.topic_name(topic))
        assert stored is not None
        assert keys.decode_marker(stored.value) == Marker(None, current, None)

        again = _run(metasrv.url, "topics", "resolve-reset", topic, "--topic-id", current, "--json")
        assert again.exit_code == Exit.CONFLICT, again.output
        assert "no topic reset is latched" in again.output
    finally:
        kv.close()


def test_resolve_reset_json_answer(
    metasrv: LiveMetasrv, kafka_bootstrap: str, etcd_endpoint: str
) -> None:
    topic = metasrv.world.purgeable_topic
    kv = EtcdKv(etcd_endpoint, f"/{metasrv.prefix}/")
    try:
        kv.put(keys.topic_name(topic), keys.encode_marker(Marker(9, None, ResetLatch("x"))))
    finally:
        kv.close()
    current = topic_id(KafkaAdmin(kafka_bootstrap), topic)
    done = _run(metasrv.url, "topics", "resolve-reset", topic, "--topic-id", current, "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {
        "topic": topic,
        "topic_id": current,
        "regions": 2,
        "previous_pruned_entry_id": 9,
        "reset_reason": "x",
    }
