"""`metasrv events` against a live metasrv after purges that deleted, were skipped and
failed on data loss: `--kind`/`--topic`/`--since`, TSV in a pipe, `--json` equal to the
REST body, an 80-column terminal, and bad option values refused before any request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from rich.cells import cell_len
from typer.testing import CliRunner, Result

from cli import app
from tests.api._live import VIEWER_TOKEN, LiveMetasrv, live_metasrv, purge_and_wait
from tests.cli._terminal import run_in_terminal

runner = CliRunner()
TSV_HEADER = [
    "at",
    "topic",
    "kind",
    "target",
    "log_start_before",
    "log_start_after",
    "high_watermark",
    "region_id",
    "procedure_id",
    "message",
]


@pytest.fixture(scope="module")
def live(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveMetasrv]:
    workdir = tmp_path_factory.mktemp("cli-events")
    with live_metasrv(
        kafka_bootstrap, etcd_endpoint, workdir, topic_prefix="greptimedb_wal_topic_"
    ) as m:
        w = m.world
        purge_and_wait(m.url, [w.purgeable_topic, w.blocked_topic, w.loss_topic])
        yield m


def _invoke(live: LiveMetasrv, *args: str) -> Result:
    return runner.invoke(
        app, ["events", *args, "--url", live.url], env={"METASRV_TOKEN": VIEWER_TOKEN}
    )


def _tsv(live: LiveMetasrv, *args: str) -> list[dict[str, str]]:
    result = _invoke(live, *args)
    assert result.exit_code == 0, result.output
    header, *lines = result.stdout.splitlines()
    assert header.split("\t") == TSV_HEADER
    rows = [line.split("\t") for line in lines]
    assert all(len(row) == len(TSV_HEADER) for row in rows), rows
    return [dict(zip(TSV_HEADER, row, strict=True)) for row in rows]


def _rest(live: LiveMetasrv, **params: Any) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{live.url}/v1/events",
        params=params,
        headers={"Authorization": f"Bearer {VIEWER_TOKEN}"},
        timeout=30,
    )
    response.raise_for_status()
    events: list[dict[str, Any]] = response.json()["events"]
    return events


def test_piped_events_are_tsv_with_every_field(live: LiveMetasrv) -> None:
    w = live.world
    rows = _tsv(live)
    assert len(rows) == 7
    deleted = next(r for r in rows if r["kind"] == "purge_deleted")
    assert deleted["topic"] == w.purgeable_topic  # full names in a pipe
    assert (deleted["target"], deleted["log_start_before"], deleted["log_start_after"]) == (
        str(w.prune_point),
        "0",
        str(w.prune_point),
    )
    assert deleted["high_watermark"] == "20" and deleted["region_id"] == ""
    assert deleted["message"].startswith(f"pruned {w.purgeable_topic} to {w.prune_point}")
    skipped = next(r for r in rows if r["kind"] == "purge_skipped")
    assert skipped["message"].startswith(f"blocked by {w.blocked_region} (no_stat)")
    loss = next(r for r in rows if r["kind"] == "wal_data_loss")
    assert loss["region_id"] == str(w.loss_region)


def test_kind_topic_and_since_filter(live: LiveMetasrv) -> None:
    w = live.world
    problems = _tsv(live, "--kind", "purge_failed", "-k", "wal_data_loss")
    assert sorted(r["kind"] for r in problems) == ["purge_failed", "wal_data_loss"]
    assert [r["kind"] for r in _tsv(live, "--topic", w.blocked_topic)] == [
        "purge_skipped",
        "purge_started",
    ]
    assert len(_tsv(live, "--since", "1h")) == 7
    assert _tsv(live, "--since", "2099-01-01T00:00:00Z") == []
    newest = datetime.fromisoformat(_rest(live)[0]["at"])
    later = (newest + timedelta(seconds=1)).isoformat()
    assert _tsv(live, "--since", later) == []
    assert len(_tsv(live, "--since", (newest - timedelta(hours=1)).isoformat())) == 7


def test_json_is_the_rest_body_with_the_same_filters(live: LiveMetasrv) -> None:
    w = live.world
    result = _invoke(live, "--json", "--kind", "purge_started", "--topic", w.loss_topic)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == _rest(live, kind="purge_started", topic=w.loss_topic)
    since = (datetime.now(UTC) - timedelta(hours=2)).replace(microsecond=0)
    result = _invoke(live, "--json", "--since", since.isoformat(), "-n", "3")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == _rest(live, since=since.isoformat(), limit=3)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--since", "yesterday"), "RFC 3339"),
        (("--since", "1700000000"), "duration"),
        (("--since", "2026-11-25T08:00:00"), "offset"),
        (("--kind", "purge_exploded"), "purge_exploded"),
        (("--limit", "0"), "limit"),
    ],
)
def test_bad_options_are_usage_errors(live: LiveMetasrv, args: tuple[str, ...], says: str) -> None:
    result = _invoke(live, *args)
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_events_fit_an_80_column_terminal(live: LiveMetasrv) -> None:
    run = run_in_terminal("events", "--url", live.url, env={"METASRV_TOKEN": VIEWER_TOKEN})
    assert run.exit_code == 0, run.stderr
    assert [line for line in run.lines if cell_len(line) > 80] == []
    assert run.lines[0].startswith("WAL events (… = ")
    for kind in ("purge_deleted", "purge_skipped", "purge_failed", "wal_data_loss"):
        assert any(kind in line.split() for line in run.lines), kind
    # The messages are shown whole below the table, wrapped at the terminal's width.
    text = " ".join(run.text.split())
    assert f"blocked by {live.world.blocked_region} (no_stat)" in text
