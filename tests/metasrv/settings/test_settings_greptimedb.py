"""GreptimeDB `[wal]` sections load as they are (tests/fixtures/greptimedb_wal/ notes each
file's origin); datanode-side keys are named in one warning; typos still fail."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from metasrv.errors import ConfigError
from metasrv.settings import IGNORED_KEYS, load_settings

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "greptimedb_wal"


def _ignored_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ignoring GreptimeDB" in r.getMessage()]


def test_greptimedb_metasrv_example_keeps_its_meaning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        wal = load_settings(FIXTURES / "metasrv.toml").wal
    assert wal.auto_create_topics is True
    assert wal.logical_delete is False  # from auto_prune_logical_delete
    assert (wal.num_topics, wal.num_partitions, wal.selector_type) == (64, 1, "round_robin")
    assert wal.create_topic_timeout == 30.0
    assert wal.auto_prune_interval == 1800.0
    assert (wal.tls, wal.sasl) == (None, None)
    # checkpoint_trigger_size is GreptimeDB's own feature: accepted, named as ignored, once.
    assert _ignored_warnings(caplog) == [
        "ignoring GreptimeDB [wal] keys metasrv does not use (datanode-side or not "
        "implemented): checkpoint_trigger_size"
    ]


def test_greptimedb_standalone_example_warns_once_naming_datanode_keys(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        wal = load_settings(FIXTURES / "standalone.toml").wal
    assert wal.broker_endpoints == ["127.0.0.1:9092"]
    assert wal.connect_timeout == 3.0
    (warning,) = _ignored_warnings(caplog)
    for key in ("max_batch_bytes", "consumer_wait_timeout", "overwrite_entry_start_id", "dir"):
        assert key in warning


def test_seed_standalone_example_loads(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        wal = load_settings(FIXTURES / "seed_standalone.toml").wal
    assert (wal.provider, wal.replication_factor) == ("kafka", 1)
    (warning,) = _ignored_warnings(caplog)
    assert warning.endswith(": max_batch_size")
    assert "max_batch_size" in IGNORED_KEYS


def test_sasl_and_tls_sections_take_greptimedb_names(tmp_path: Path) -> None:
    path = tmp_path / "wal.toml"
    path.write_text(
        '[wal]\nbroker_endpoints = ["b:9093"]\n'
        '[wal.sasl]\ntype = "SCRAM-SHA-512"\nusername = "user_kafka"\npassword = "secret"\n'
        '[wal.tls]\nserver_ca_cert_path = "/ca.pem"\n'
    )
    wal = load_settings(path).wal
    assert wal.sasl is not None and wal.sasl.type == "SCRAM-SHA-512"
    assert wal.sasl.password.get_secret_value() == "secret"
    assert "secret" not in repr(wal)
    assert wal.tls is not None and wal.tls.server_ca_cert_path == "/ca.pem"


@pytest.mark.parametrize(
    ("wal", "message"),
    [
        ({"num_topic": 3}, "did you mean 'num_topics'"),
        ({"max_batch_sise": "1MB"}, "did you mean 'max_batch_size'"),
        ({"sasl": {"type": "GSSAPI", "username": "u", "password": "p"}}, "wal.sasl.type"),
        ({"tls": {"client_cert_path": "/c.pem"}}, "client_key_path"),
        ({"provider": "raft_engine"}, "wal.provider"),
        ({"logical_delete": True, "auto_prune_logical_delete": False}, "same setting"),
        ({"topic_config": {"cleanup.policy": "compact"}}, "cleanup.policy"),
    ],
)
def test_bad_wal_sections_fail_clearly(wal: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(None, wal=wal)


@pytest.mark.parametrize("topic_config", [{}, {"retention.ms": "-1"}, {"segment.bytes": "1048576"}])
def test_logical_delete_without_finite_retention_refuses(topic_config: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="logical_delete = true needs a finite retention"):
        load_settings(None, wal={"auto_prune_logical_delete": True, "topic_config": topic_config})


@pytest.mark.parametrize("retention", [{"retention.ms": "604800000"}, {"retention.bytes": "1"}])
def test_logical_delete_with_finite_retention_loads(retention: dict[str, str]) -> None:
    wal = load_settings(None, wal={"logical_delete": True, "topic_config": retention}).wal
    assert wal.logical_delete is True
    assert wal.topic_creation_config() == {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        **retention,
    }
