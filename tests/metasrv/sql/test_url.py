"""Which database URLs are the embedded SQLite default, and its migration on open."""

from __future__ import annotations

from pathlib import Path

import pytest

import migrations
from metasrv.sql import is_memory_sqlite, is_sqlite, migrate_embedded, sqlite_file


@pytest.mark.parametrize(
    ("url", "sqlite", "memory"),
    [
        ("sqlite:///kv.db", True, False),
        ("sqlite+pysqlite:////abs/kv.db", True, False),
        ("sqlite://", True, True),
        ("sqlite:///:memory:", True, True),
        ("postgresql://u@db/metasrv", False, False),
    ],
)
def test_is_sqlite(url: str, sqlite: bool, memory: bool) -> None:
    assert (is_sqlite(url), is_memory_sqlite(url)) == (sqlite, memory)
    assert (sqlite_file(url) is not None) == (sqlite and not memory)


def test_a_sqlite_file_resolves_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert sqlite_file("sqlite:///kv.db") == tmp_path.resolve() / "kv.db"


def test_only_a_sqlite_file_is_migrated_on_open(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    assert migrate_embedded(url)
    assert migrations.current_revision(url) == migrations.head_revision()
    assert not migrate_embedded("sqlite://")
    assert not migrate_embedded("postgresql://nobody@127.0.0.1:1/none")  # never connected
