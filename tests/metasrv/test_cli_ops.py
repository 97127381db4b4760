"""Operator CLI: target resolution and messages, then the whole flow against a live metasrv."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from metasrv.cli import app
from metasrv.cli._ops import Exit, resolve_target, why_not_purged
from metasrv.model import BlockingRegion, TopicPlan

runner = CliRunner()


def _plan(**overrides: object) -> TopicPlan:
    base: dict[str, object] = {
        "topic": "wal_0",
        "prune_point": 50,
        "pruned_entry_id": 10,
        "log_start_offset": 10,
        "high_watermark": 100,
        "blocked_by": (),
        "reclaimable_entries": 40,
        "region_count": 2,
    }
    base.update(overrides)
    return TopicPlan(**base)  # type: ignore[arg-type]


def test_why_names_blockers_data_loss_and_progress() -> None:
    assert why_not_purged(_plan()) == "purgeable: 40 entries below 50"
    blocked = _plan(
        prune_point=None,
        reclaimable_entries=0,
        blocked_by=(BlockingRegion(7, "no_stat"), BlockingRegion(8, "stale_stat")),
    )
    assert why_not_purged(blocked) == "blocked by region 7 (no_stat), region 8 (stale_stat)"
    lost = _plan(data_loss=(9,), blocked_by=(BlockingRegion(9, "retention_overrun"),))
    assert why_not_purged(lost).startswith("WAL DATA LOSS")
    assert "9" in why_not_purged(lost)
    assert why_not_purged(_plan(prune_point=None, region_count=0, reclaimable_entries=0)) == (
        "no regions mapped"
    )
    assert why_not_purged(_plan(reclaimable_entries=0)).startswith("up to date")


def test_target_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "metasrv.toml"
    config.write_text(
        '[http]\naddr = "0.0.0.0:4123"\n'
        '[auth]\noperator_tokens = ["op"]\nviewer_tokens = ["view"]\n'
    )
    monkeypatch.delenv("METASRV_HTTP__ADDR", raising=False)
    assert resolve_target(None, None, config, write=True) == resolve_target(
        "127.0.0.1:4123", "op", None, write=True
    )
    read = resolve_target(None, None, config, write=False)
    assert (read.url, read.token) == ("http://127.0.0.1:4123", "view")
    explicit = resolve_target("http://h:1", None, config, write=True)
    assert (explicit.url, explicit.token) == ("http://h:1", "op")
    bare = resolve_target(None, None, None, write=True)
    assert (bare.url, bare.token) == ("http://127.0.0.1:4000", None)


def test_unreachable_exits_3_and_says_so() -> None:
    result = runner.invoke(app, ["status", "--url", "127.0.0.1:9", "--token", "x"])
    assert result.exit_code == Exit.UNREACHABLE
    assert "unreachable" in result.output


def test_bad_config_exits_2() -> None:
    result = runner.invoke(app, ["status", "--config", "/nonexistent/metasrv.toml"])
    assert result.exit_code == Exit.USAGE
    assert "config file not found" in result.output


def test_usage_error_exits_2() -> None:
    result = runner.invoke(app, ["regions", "add", "not-a-number", "--node", "1"])
    assert result.exit_code == 2
