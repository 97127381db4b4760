"""`[wal] min_insync_replicas`: validated against the replication factor and `topic_config`,
applied to created topics; `below_configured` names what is short. Pure, no services."""

from __future__ import annotations

import pytest

from metasrv.errors import ConfigError
from metasrv.kafka import below_configured
from metasrv.model import TopicDurability
from metasrv.settings import load_settings


def test_min_insync_replicas_is_set_on_created_topics() -> None:
    wal = load_settings(wal={"replication_factor": 3, "min_insync_replicas": 2}).wal
    assert wal.topic_creation_config() == {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "min.insync.replicas": "2",
    }
    assert wal.wanted_min_insync_replicas == 2


def test_unset_leaves_kafkas_default() -> None:
    wal = load_settings(wal={"replication_factor": 3}).wal
    assert "min.insync.replicas" not in wal.topic_creation_config()
    assert wal.wanted_min_insync_replicas is None


def test_the_same_value_in_topic_config_is_fine_and_topic_config_alone_counts() -> None:
    both = load_settings(
        wal={
            "replication_factor": 3,
            "min_insync_replicas": 2,
            "topic_config": {"min.insync.replicas": "2"},
        }
    ).wal
    assert both.topic_creation_config()["min.insync.replicas"] == "2"
    alone = load_settings(
        wal={"replication_factor": 3, "topic_config": {"min.insync.replicas": "2"}}
    ).wal
    assert alone.wanted_min_insync_replicas == 2


@pytest.mark.parametrize(
    ("wal", "says"),
    [
        ({"replication_factor": 1, "min_insync_replicas": 2}, "must be <= replication_factor"),
        ({"replication_factor": 3, "min_insync_replicas": 0}, "greater than or equal to 1"),
        (
            {
                "replication_factor": 3,
                "min_insync_replicas": 2,
                "topic_config": {"min.insync.replicas": "1"},
            },
            "conflicts with topic_config",
        ),
        ({"min_insync_replica": 2}, "did you mean 'min_insync_replicas'"),
    ],
)
def test_bad_values_are_config_errors(wal: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_settings(wal=wal)


def test_below_configured_names_topics_short_of_rf_or_min_isr() -> None:
    found = {
        "ok": TopicDurability(replication_factor=3, min_insync_replicas=2),
        "rf1": TopicDurability(replication_factor=1, min_insync_replicas=1),
        "isr1": TopicDurability(replication_factor=3, min_insync_replicas=1),
        "unknown_isr": TopicDurability(replication_factor=3, min_insync_replicas=None),
    }
    short = below_configured(found, replication_factor=3, min_insync_replicas=2)
    assert short == {
        "isr1": "min.insync.replicas 1 < 2",
        "rf1": "replication factor 1 < 3, min.insync.replicas 1 < 2",
    }
    assert below_configured(found, replication_factor=1, min_insync_replicas=None) == {}
