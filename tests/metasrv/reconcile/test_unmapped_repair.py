"""`metasrv reconcile --apply` never registers a region over WAL data loss: real etcd, Kafka,
Spark local[2] and a running metasrv.

A region that wrote to a topic while unmapped was left out of the topic's purges. Once
registered, the plan's `max(prunable, marker)` and replay-start treat it as needing nothing
at or below the marker, so entries it needs there would be skipped silently. The run
reports such a region as WAL data loss (critical) and leaves it unregistered; a region
whose needs all lie above the marker and Kafka's log start is still registered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

import migrations
from metasrv import keys
from metasrv.reconcile import HIDES_ENTRIES, Outcome, RunOptions, run_reconcile
from metasrv.stat_history import cluster_root
from tests.metasrv.reconcile._seed import stat, write_history
from tests.metasrv.reconcile.test_run import Cluster, _produce
from toolbox.simulator import MetasrvProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PURGED_TO = 20
"""The topic's marker and Kafka's log start: entries below 20 are gone."""


@pytest.fixture
def cluster(
    tmp_path: Path, unique_prefix: str, etcd_endpoint: str, kafka_bootstrap: str
) -> Iterator[Cluster]:
    c = Cluster(tmp_path, unique_prefix, etcd_endpoint, kafka_bootstrap)
    try:
        yield c
    finally:
        c.close()


def seed(cluster: Cluster, now: float) -> str:
    t1 = cluster.t[1]
    cluster.kafka.ensure_topics(cluster.t)  # the whole pool: no topic to create
    _produce(cluster.kafka.bootstrap, t1, 30)
    cluster.kafka.delete_records({t1: PURGED_TO})
    cluster.kv.batch_put(
        [
            (keys.topic_name(t1), orjson.dumps({"pruned_entry_id": PURGED_TO})),
            (keys.topic_region(t1, 1), keys.encode_route(1, None)),  # healthy
        ]
    )
    write_history(
        cluster_root(cluster.settings()),
        [
            (
                now - 30,
                {1: stat(1, t1, now - 31, prunable=25)},
                [
                    stat(4, t1, now - 33, node_id=6, prunable=25),  # needs 26..: safe
                    stat(6, t1, now - 34, node_id=6, prunable=10),  # needs 11..19: purged
                ],
            ),
        ],
    )
    return t1


@pytest.mark.timeout(600)
def test_apply_registers_no_region_whose_entries_lie_below_the_marker(
    spark: SparkSession, cluster: Cluster
) -> None:
    t1 = seed(cluster, time.time())
    settings = cluster.settings()
    migrations.upgrade(settings.history.url)
    options = RunOptions(
        master="local[2]", out_dir=cluster.tmp / "out", apply=True, drop_stale_after=None
    )
    before = cluster.regions()
    with MetasrvProcess(
        cluster.config, cluster.tmp / "metasrv.log", f"http://127.0.0.1:{cluster.port}"
    ):
        report = run_reconcile(settings, options, spark=spark)
        after = cluster.regions()

    assert report.counts["unmapped_region"] == {"critical": 1, "warning": 1}
    done = {(r.action.kind.value, r.action.region_id) for r in report.actions}
    assert done == {("register_region", 4)}
    assert [r.outcome for r in report.actions] == [Outcome.DONE]
    assert keys.topic_region(t1, 4) in after
    assert keys.topic_region(t1, 6) not in after  # left as a finding: WAL data loss
    assert after[keys.topic_region(t1, 1)] == before[keys.topic_region(t1, 1)]
    skipped = report.summary["apply"]["skipped"]
    assert skipped == {HIDES_ENTRIES: 1}, skipped
