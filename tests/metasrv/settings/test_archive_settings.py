"""`[wal.archive]` and `[wal] pin_consumer_groups` (DESIGN §6, §8): defaults, units, validation,
`METASRV_` overrides and the set of pinned groups. Pure, no services."""

from __future__ import annotations

from pathlib import Path

import pytest

from metasrv.errors import ConfigError
from metasrv.settings import load_settings


def test_defaults_are_designs_and_the_archive_is_off() -> None:
    wal = load_settings().wal
    archive = wal.archive
    assert archive.enabled is False
    assert (archive.endpoint, archive.bucket, archive.prefix, archive.region) == (
        "",
        "metasrv-wal",
        "",
        "us-east-1",
    )
    assert archive.access_key_id == "" and archive.secret_access_key.get_secret_value() == ""
    assert archive.consumer_group == "metasrv-archive"
    assert archive.object_max_bytes == 64 * 1024**2
    assert archive.object_max_delay == 60.0
    assert archive.retention == 7 * 86400.0
    assert wal.pin_consumer_groups == []
    assert wal.pinned_groups == ()


def test_a_toml_file_with_every_key(tmp_path: Path) -> None:
    path = tmp_path / "metasrv.toml"
    path.write_text(
        "[wal]\n"
        'pin_consumer_groups = ["cdc", "standby"]\n'
        "[wal.archive]\n"
        "enabled = true\n"
        'endpoint = "http://127.0.0.1:19000"\n'
        'bucket = "wal.archive-1"\n'
        'prefix = "prod/"\n'
        'region = "eu-west-1"\n'
        'access_key_id = "AKID"\n'
        'secret_access_key = "secret"\n'
        'consumer_group = "archivers"\n'
        'object_max_bytes = "16MiB"\n'
        'object_max_delay = "1m30s"\n'
        'retention = "0s"\n'
    )
    wal = load_settings(path).wal
    archive = wal.archive
    assert archive.enabled and archive.endpoint == "http://127.0.0.1:19000"
    assert (archive.bucket, archive.prefix, archive.region) == (
        "wal.archive-1",
        "prod/",
        "eu-west-1",
    )
    assert archive.access_key_id == "AKID"
    assert archive.secret_access_key.get_secret_value() == "secret"
    assert "secret" not in repr(archive)
    assert archive.object_max_bytes == 16 * 1024**2
    assert archive.object_max_delay == 90.0
    assert archive.retention == 0.0
    assert wal.pinned_groups == ("cdc", "standby", "archivers")


def test_the_archive_group_is_pinned_only_while_the_archive_is_enabled() -> None:
    off = load_settings(wal={"pin_consumer_groups": ["cdc"], "archive": {"consumer_group": "a"}})
    assert off.wal.pinned_groups == ("cdc",)
    on = load_settings(wal={"pin_consumer_groups": ["a"], "archive": {"enabled": True}})
    assert on.wal.pinned_groups == ("a", "metasrv-archive")
    same = load_settings(
        wal={"pin_consumer_groups": ["a"], "archive": {"enabled": True, "consumer_group": "a"}}
    )
    assert same.wal.pinned_groups == ("a",)


def test_environment_overrides_merge_with_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "metasrv.toml"
    path.write_text('[wal.archive]\nbucket = "from-file"\nprefix = "p/"\n')
    monkeypatch.setenv("METASRV_WAL__ARCHIVE__ENABLED", "true")
    monkeypatch.setenv("METASRV_WAL__ARCHIVE__PREFIX", "env/")
    monkeypatch.setenv("METASRV_WAL__ARCHIVE__OBJECT_MAX_DELAY", "5s")
    monkeypatch.setenv("METASRV_WAL__PIN_CONSUMER_GROUPS", '["cdc"]')
    wal = load_settings(path).wal
    assert wal.archive.enabled and wal.archive.bucket == "from-file"
    assert wal.archive.prefix == "env/" and wal.archive.object_max_delay == 5.0
    assert wal.pinned_groups == ("cdc", "metasrv-archive")


@pytest.mark.parametrize(
    ("wal", "says"),
    [
        ({"archive": {"enabeld": True}}, "wal.archive.enabeld: Extra inputs are not permitted"),
        ({"archive": {"enabeld": True}}, "did you mean 'enabled'"),
        ({"archive": {"object_max_bytes": "64 parsecs"}}, "invalid size"),
        ({"archive": {"object_max_bytes": "0B"}}, "greater than 0"),
        ({"archive": {"object_max_delay": "0s"}}, "greater than 0"),
        ({"archive": {"object_max_delay": "soon"}}, "invalid duration"),
        ({"archive": {"retention": "-1s"}}, "invalid duration"),
        ({"archive": {"endpoint": "127.0.0.1:9000"}}, "http:// or https:// URL"),
        ({"archive": {"endpoint": "ftp://host"}}, "http:// or https:// URL"),
        ({"archive": {"bucket": "Upper_Case"}}, "wal.archive.bucket"),
        ({"archive": {"bucket": "ab"}}, "wal.archive.bucket"),
        ({"archive": {"prefix": "/abs/"}}, "must not start with '/'"),
        ({"archive": {"consumer_group": ""}}, "wal.archive.consumer_group"),
        ({"archive": {"region": ""}}, "wal.archive.region"),
        ({"archive": {"access_key_id": "AKID"}}, "go together"),
        ({"archive": {"secret_access_key": "s"}}, "go together"),
        ({"pin_consumer_groups": "cdc"}, "wal.pin_consumer_groups"),
        ({"pin_consumer_groups": [""]}, "wal.pin_consumer_groups.0"),
        ({"pin_consumer_groups": ["cdc", "cdc"]}, "names 'cdc' twice"),
        ({"pin_consumer_group": ["cdc"]}, "did you mean 'pin_consumer_groups'"),
    ],
)
def test_bad_values_are_config_errors_naming_the_key(wal: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match="invalid configuration") as info:
        load_settings(wal=wal)
    assert says in info.value.message


def test_a_bad_environment_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METASRV_WAL__ARCHIVE__OBJECT_MAX_BYTES", "lots")
    with pytest.raises(ConfigError, match=r"wal\.archive\.object_max_bytes"):
        load_settings()
