"""Operator CLI: target resolution and messages, then the whole flow against a live metasrv."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from cli import Exit, app, resolve_target, why_not_purged
from metasrv import wire
from tests.api._live import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    World,
    live_metasrv,
)
from tests.cli._terminal import run_in_terminal

runner = CliRunner()


def _plan(**overrides: object) -> wire.TopicPlan:
    base: dict[str, object] = {
        "topic": "wal_0",
        "prune_point": 50,
        "pruned_entry_id": 10,
        "log_start_offset": 10,
        "high_watermark": 100,
        "blocked_by": [],
        "reclaimable_entries": 40,
        "data_loss": [],
        "region_count": 2,
    }
    base.update(overrides)
    return wire.TopicPlan(**base)  # type: ignore[arg-type]


def _blocking(region_id: int, reason: str) -> wire.BlockingRegion:
    return wire.BlockingRegion(region_id=region_id, reason=wire.BlockReason(reason))


def test_why_names_blockers_data_loss_and_progress() -> None:
    assert why_not_purged(_plan()) == "purgeable: 40 entries below 50"
    blocked = _plan(
        prune_point=None,
        reclaimable_entries=0,
        blocked_by=[_blocking(7, "no_stat"), _blocking(8, "stale_stat")],
    )
    assert why_not_purged(blocked) == "blocked by region 7 (no_stat), region 8 (stale_stat)"
    short = _plan(
        blocked_by=[wire.BlockingRegion(topic="t", reason=wire.BlockReason("not_archived"))]
    )
    assert why_not_purged(short) == "blocked by the WAL archive (not_archived)"
    lost = _plan(data_loss=[9], blocked_by=[_blocking(9, "retention_overrun")])
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


# --- against a live metasrv ----------------------------------------------------------------


class LiveCli:
    """Runs `metasrv ...` in-process against the served metasrv."""

    def __init__(self, url: str, world: World) -> None:
        self.url = url
        self.world = world

    def run(self, *args: str, token: str | None = OPERATOR_TOKEN, **env: str) -> Result:
        full_env = {"COLUMNS": "250", "METASRV_TOKEN": token or "", **env}
        return runner.invoke(app, [*args, "--url", self.url], env=full_env)

    def json(self, *args: str, token: str | None = OPERATOR_TOKEN) -> Any:
        result = self.run(*args, "--json", token=token)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


@pytest.fixture(scope="module")
def cli(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveCli]:
    workdir = tmp_path_factory.mktemp("cli-ops")
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir) as metasrv:
        yield LiveCli(metasrv.url, metasrv.world)


def test_operator_sees_why_purges_then_follows_and_reads_history(cli: LiveCli) -> None:
    w = cli.world
    status = cli.run("status", token=VIEWER_TOKEN)
    assert status.exit_code == 0, status.output
    assert f"blocked by region {w.blocked_region} (no_stat)" in status.stdout
    assert f"WAL DATA LOSS: Kafka no longer holds entries needed by region(s) {w.loss_region}" in (
        status.stdout
    )
    assert f"purgeable: {w.prune_point} entries below {w.prune_point}" in status.stdout

    topics = {t["topic"]: t for t in cli.json("status", token=VIEWER_TOKEN)["topics"]}
    assert topics[w.purgeable_topic]["prune_point"] == w.prune_point
    assert topics[w.purgeable_topic]["log_start_offset"] == 0
    assert topics[w.purgeable_topic]["high_watermark"] == 20
    assert topics[w.blocked_topic]["blocked_by"] == [
        {"region_id": w.blocked_region, "reason": "no_stat"}
    ]

    (plan,) = cli.json("purge", "--topic", w.purgeable_topic, "--dry-run")
    assert plan["reclaimable_entries"] == w.prune_point
    assert cli.json("history", "--topic", w.purgeable_topic) == []

    purge = cli.run("purge", "--topic", w.purgeable_topic, "--wait", "--json")
    assert purge.exit_code == 0, purge.output
    (proc,) = json.loads(purge.stdout)
    assert proc["state"] == "succeeded"
    assert purge.stderr == ""  # --json: no progress lines, stdout is pure JSON

    (row,) = cli.json("history", "--topic", w.purgeable_topic)
    assert row["procedure_id"] == proc["id"]
    assert row["prune_point"] == w.prune_point
    assert row["entries_deleted"] == w.prune_point
    text = cli.run("history", token=VIEWER_TOKEN)
    assert text.exit_code == 0 and proc["id"] in text.stdout

    shown = cli.json("procedures", "show", proc["id"], token=VIEWER_TOKEN)
    assert shown["state"] == "succeeded" and "purge" in shown["timings"]
    after = {t["topic"]: t for t in cli.json("status", token=VIEWER_TOKEN)["topics"]}
    assert after[w.purgeable_topic]["pruned_entry_id"] == w.prune_point
    assert after[w.purgeable_topic]["log_start_offset"] == w.prune_point
    cancel = cli.run("procedures", "cancel", proc["id"])
    assert cancel.exit_code == Exit.CONFLICT, cancel.output


def test_failed_purge_exits_1_and_status_shows_it(cli: LiveCli) -> None:
    w = cli.world
    result = cli.run("purge", "--topic", w.loss_topic, "--wait")
    assert result.exit_code == Exit.PURGE_FAILED, result.output
    assert "failed" in result.stdout and "wal_data_loss" in result.output
    assert f"{w.loss_topic}: failed" in result.stderr  # progress lines
    status = cli.json("status", token=VIEWER_TOKEN)
    assert [p["topic"] for p in status["failed_procedures"]] == [w.loss_topic]
    assert [e["region_id"] for e in status["data_loss_events"]] == [w.loss_region]
    # In a terminal (a pipe gets the topics as TSV only), status shows both sections.
    shown = run_in_terminal("status", "--url", cli.url, env={"METASRV_TOKEN": VIEWER_TOKEN})
    assert shown.exit_code == 0, shown.stderr
    assert "WAL data-loss events" in shown.text and "Recently failed procedures" in shown.text


def test_submit_without_wait_prints_ids(cli: LiveCli) -> None:
    result = cli.run("purge", "--topic", cli.world.blocked_topic)
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.strip().splitlines()
    procedure_id = line.removeprefix("submitted ")
    done = cli.json("procedures", "show", procedure_id, token=VIEWER_TOKEN)
    assert done["topic"] == cli.world.blocked_topic


def test_regions_add_list_drop(cli: LiveCli) -> None:
    w = cli.world
    region = (4000 << 32) | 7
    added = cli.json("regions", "add", str(region), "--node", "3", "--topic", w.blocked_topic)
    assert added["topic"] == w.blocked_topic
    listed = cli.json("regions", "list", "--topic", w.blocked_topic, token=VIEWER_TOKEN)
    assert {r["region_id"] for r in listed} == {w.blocked_region, region}
    table = cli.run("regions", "list", token=VIEWER_TOKEN)
    assert str(region) in table.stdout and "4000" in table.stdout
    dropped = cli.run("regions", "drop", str(region))
    assert dropped.exit_code == 0, dropped.output
    assert cli.run("regions", "drop", str(region)).exit_code == Exit.NOT_FOUND
    listed = cli.json("regions", "list", "--topic", w.blocked_topic, token=VIEWER_TOKEN)
    assert {r["region_id"] for r in listed} == {w.blocked_region}


def test_wrong_tokens_exit_3(cli: LiveCli) -> None:
    denied = cli.run("purge", "--dry-run", token=VIEWER_TOKEN)
    assert denied.exit_code == Exit.UNREACHABLE
    assert "permission_denied" in denied.output
    unknown = cli.run("status", token="not-a-token")
    assert unknown.exit_code == Exit.UNREACHABLE
    assert "unauthenticated" in unknown.output
    assert cli.run("purge", "--topic", "no_such_topic").exit_code == Exit.NOT_FOUND


def test_url_and_token_from_config(cli: LiveCli, tmp_path: Path) -> None:
    config = tmp_path / "metasrv.toml"
    addr = cli.url.removeprefix("http://")
    config.write_text(f'[http]\naddr = "{addr}"\n[auth]\nviewer_tokens = ["{VIEWER_TOKEN}"]\n')
    result = runner.invoke(app, ["status", "--json", "-c", str(config)], env={"METASRV_TOKEN": ""})
    assert result.exit_code == 0, result.output
    assert cli.world.purgeable_topic in {t["topic"] for t in json.loads(result.stdout)["topics"]}
