"""The read commands against a live metasrv: tables that fit an 80-column terminal, TSV in a
pipe, `--json` equal to what the REST API answers, and `metasrv --version`."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any

import httpx
import msgspec
import pytest
from rich.cells import cell_len
from sqlalchemy import create_engine
from typer.testing import CliRunner

from cli import app, why_not_purged
from metasrv import wire
from metasrv.reconcile import Finding, FindingKind, RunRecord, Severity, save_run
from tests.api._live import VIEWER_TOKEN, LiveMetasrv, live_metasrv, purge_and_wait
from tests.cli._terminal import run_in_terminal
from toolbox.simulator import metasrv_argv

runner = CliRunner()
VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
# As GreptimeDB names them: long, and all but the last few characters shared.
TOPIC_PREFIX = "greptimedb_wal_topic_"


@pytest.fixture(scope="module")
def live(
    kafka_bootstrap: str, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveMetasrv]:
    """The seeded world, one purge that succeeded and one that failed on data loss, and a
    recorded reconcile run."""
    workdir = tmp_path_factory.mktemp("cli-output")
    with live_metasrv(kafka_bootstrap, etcd_endpoint, workdir, topic_prefix=TOPIC_PREFIX) as m:
        purge_and_wait(m.url, [m.world.purgeable_topic])
        purge_and_wait(m.url, [m.world.loss_topic])
        _record_reconcile_run(f"sqlite:///{workdir / f'{m.prefix}-history.db'}", m)
        yield m


def _record_reconcile_run(history_url: str, m: LiveMetasrv) -> None:
    engine = create_engine(history_url)
    at = datetime.now(UTC)
    finding = Finding(
        FindingKind.UNMAPPED_REGION,
        Severity.WARNING,
        m.world.blocked_topic,
        m.world.blocked_region,
        "a datanode reports a region no route maps",
        {"node_id": 2},
    )
    try:
        save_run(
            engine,
            RunRecord(
                run_id="run-cli-output",
                started_at=at - timedelta(seconds=3),
                finished_at=at,
                status="succeeded",
                master="local[2]",
                applied=False,
                kv_revision=1,
                counts={"unmapped_region": {"warning": 1}},
                findings_total=1,
                out_dir=None,
                summary={"notes": []},
            ),
            [finding],
            limit=100,
            keep_runs=5,
        )
    finally:
        engine.dispose()


def _rest(live: LiveMetasrv, path: str, **params: Any) -> Any:
    response = httpx.get(f"{live.url}{path}", params=params, headers=VIEWER, timeout=30)
    response.raise_for_status()
    return response.json()


def _cli(live: LiveMetasrv, *args: str) -> str:
    """stdout of `metasrv *args` run in-process (stdout is not a terminal there)."""
    result = runner.invoke(app, [*args, "--url", live.url], env={"METASRV_TOKEN": VIEWER_TOKEN})
    assert result.exit_code == 0, result.output
    return result.stdout


def _topics(live: LiveMetasrv) -> list[wire.Topic]:
    body = httpx.get(f"{live.url}/v1/topics", headers=VIEWER, timeout=30).content
    return msgspec.json.decode(body, type=wire.TopicList).topics


# --- a terminal 80 columns wide ----------------------------------------------------------------


def _section(lines: list[str], starts: str) -> list[str]:
    """The lines after the first one starting with `starts`, up to a blank line or the
    notes below a table (`why:`, ...)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(starts))
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].strip() or lines[i][-1] == ":"),
        len(lines),
    )
    return lines[start + 1 : end]


def test_status_fits_80_columns_with_distinct_topic_names(live: LiveMetasrv) -> None:
    run = run_in_terminal("status", "--url", live.url, env={"METASRV_TOKEN": VIEWER_TOKEN})
    assert run.exit_code == 0, run.stderr
    assert [line for line in run.lines if cell_len(line) > 80] == []

    topics = _topics(live)
    shown = {t.topic: "…" + t.topic.removeprefix(live.prefix) for t in topics}
    assert sorted(shown.values()) == ["…_0", "…_1", "…_2"]
    assert f"Topics (… = {live.prefix})" in [line.rstrip() for line in run.lines]
    table = _section(run.lines, "Topics (")
    assert table[0].split()[0] == "topic"  # the header, then one row per topic
    rows = [line for line in table if line.startswith("…") or line.startswith(live.prefix)]
    assert sorted(row.split()[0] for row in rows) == sorted(shown.values())
    # Nothing cut short: rich marks a truncated cell with a trailing ellipsis.
    cut = [t for line in run.lines for t in line.split() if t.endswith("…") and t != "(…"]
    assert cut == [], cut

    # Each topic's "why" starts on its topic's line and wraps at the terminal's width, not
    # word by word in a narrow column.
    why = _section(run.lines, "why:")
    for topic in topics:
        expected = why_not_purged(topic)
        start = next(i for i, line in enumerate(why) if line.split()[0] == shown[topic.topic])
        first = why[start].split(maxsplit=1)[1]
        rest = []
        for line in why[start + 1 :]:
            if not line.startswith(" "):
                break
            rest.append(line)
        assert " ".join([first, *rest]).split() == expected.split(), (why, expected)
        assert len(first.split()) >= (len(expected.split()) + 1) // 2, why
        assert len(rest) <= 1, why  # these verdicts fit two 80-column lines
    loss = next(line for line in why if line.startswith(shown[live.world.loss_topic]))
    assert "WAL DATA LOSS" in loss

    # The other sections fit too and name topics the same way.
    failed = _section(run.lines, "Recently failed procedures")
    assert any(shown[live.world.loss_topic] in line.split() for line in failed), failed
    assert any(line.startswith("WAL data-loss events") for line in run.lines)


def test_status_in_a_wide_terminal_keeps_full_rows(live: LiveMetasrv) -> None:
    run = run_in_terminal(
        "status", "--url", live.url, columns=250, env={"METASRV_TOKEN": VIEWER_TOKEN}
    )
    assert run.exit_code == 0, run.stderr
    assert [line for line in run.lines if cell_len(line) > 250] == []
    header = _section(run.lines, "Topics (")[0].split()
    assert header[0] == "topic" and header[-1] == "why"  # the verdict is the last column


@pytest.mark.parametrize("args", [("status",), ("regions", "list"), ("procedures", "list")])
def test_narrower_terminals_get_one_block_per_row(live: LiveMetasrv, args: tuple[str, ...]) -> None:
    run = run_in_terminal(*args, "--url", live.url, columns=44, env={"METASRV_TOKEN": VIEWER_TOKEN})
    assert run.exit_code == 0, run.stderr
    assert [line for line in run.lines if cell_len(line) > 44] == []
    blocks = {line.split()[0] for line in run.lines if line and not line[0].isspace()}
    if args == ("status",):
        assert {"…_0", "…_1", "…_2"} <= blocks, run.text
        assert any(line.startswith("  regions 2  prune point 9  ") for line in run.lines), run.text
    elif args == ("regions", "list"):
        assert {str(r["region_id"]) for r in _rest(live, "/v1/regions")["regions"]} <= blocks
    else:
        assert {p["id"] for p in _rest(live, "/v1/procedures")["procedures"]} <= blocks


# --- a pipe -------------------------------------------------------------------------------------


def _tsv(text: str) -> tuple[list[str], list[dict[str, str]]]:
    lines = text.splitlines()
    fields = [line.split("\t") for line in lines]
    assert len({len(f) for f in fields}) == 1, f"column count varies:\n{text}"
    header = fields[0]
    return header, [dict(zip(header, f, strict=True)) for f in fields[1:]]


def test_piped_status_is_tsv_of_every_topic(live: LiveMetasrv) -> None:
    proc = subprocess.run(
        metasrv_argv("status", "--url", live.url),
        env={**_env(), "METASRV_TOKEN": VIEWER_TOKEN, "COLUMNS": "80"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    header, rows = _tsv(proc.stdout.decode())
    assert header == [
        "topic",
        "regions",
        "prune_point",
        "pruned_entry_id",
        "log_start_offset",
        "high_watermark",
        "reclaimable_entries",
        "rf_min_isr",
        "why",
    ]
    topics = {t.topic: t for t in _topics(live)}
    assert sorted(r["topic"] for r in rows) == sorted(topics)  # full names, one row each
    for row in rows:
        topic = topics[row["topic"]]
        assert row["prune_point"] == ("" if topic.prune_point is None else str(topic.prune_point))
        assert row["log_start_offset"] == str(topic.log_start_offset)
        assert row["high_watermark"] == str(topic.high_watermark)
        assert row["regions"] == str(topic.region_count)
        assert row["why"] == why_not_purged(topic)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("METASRV_URL", "METASRV_TOKEN")}


@pytest.mark.parametrize(
    ("args", "first_column"),
    [
        (("topics", "list"), "topic"),
        (("plan",), "topic"),
        (("regions", "list"), "region_id"),
        (("procedures", "list"), "id"),
        (("history",), "finished_at"),
        (("events",), "at"),
        (("leader",), "leader"),
        (("reconcile", "latest"), "severity"),
    ],
)
def test_piped_read_commands_are_tsv(
    live: LiveMetasrv, args: tuple[str, ...], first_column: str
) -> None:
    header, rows = _tsv(_cli(live, *args))
    assert header[0] == first_column
    assert rows, f"{args}: no rows"


# --- --json -------------------------------------------------------------------------------------


def _without_ages(value: Any) -> Any:
    """A region stat's `age_seconds` grows between two reads; everything else must match."""
    if isinstance(value, dict):
        return {k: _without_ages(v) for k, v in value.items() if k != "age_seconds"}
    if isinstance(value, list):
        return [_without_ages(v) for v in value]
    return value


def test_json_is_the_rest_body(live: LiveMetasrv) -> None:
    w = live.world
    procedures = _rest(live, "/v1/procedures")["procedures"]
    assert procedures, "the fixture's purges left no procedure"
    pid = procedures[0]["id"]
    cases: list[tuple[tuple[str, ...], Any]] = [
        (("topics", "list"), _rest(live, "/v1/topics")["topics"]),
        (("topics", "show", w.purgeable_topic), _rest(live, f"/v1/topics/{w.purgeable_topic}")),
        (("plan",), _rest(live, "/v1/purge/plan")["topics"]),
        (
            ("plan", "--topic", w.blocked_topic),
            _rest(live, "/v1/purge/plan", topic=w.blocked_topic)["topics"],
        ),
        (("regions", "list"), _rest(live, "/v1/regions")["regions"]),
        (("regions", "show", str(w.loss_region)), _rest(live, f"/v1/regions/{w.loss_region}")),
        (("procedures", "list"), procedures),
        (
            ("procedures", "list", "--state", "failed"),
            _rest(live, "/v1/procedures", state="failed")["procedures"],
        ),
        (("procedures", "show", pid), _rest(live, f"/v1/procedures/{pid}")),
        (("history",), _rest(live, "/v1/purge/history", limit=20)["purges"]),
        (("events",), _rest(live, "/v1/events")["events"]),
        (("leader",), _rest(live, "/v1/leader")),
        (("reconcile", "latest"), _rest(live, "/v1/reconcile/latest")),
    ]
    for args, body in cases:
        printed = json.loads(_cli(live, *args, "--json"))
        assert _without_ages(printed) == _without_ages(body), args

    status = json.loads(_cli(live, "status", "--json"))
    assert status["leader"] == _rest(live, "/v1/leader")
    assert status["topics"] == _rest(live, "/v1/topics")["topics"]
    assert (
        status["failed_procedures"] == _rest(live, "/v1/procedures", state="failed")["procedures"]
    )
    events = _rest(live, "/v1/events", kind="wal_data_loss", limit=20)["events"]
    assert events and status["data_loss_events"] == events
    one = json.loads(_cli(live, "status", "--topic", w.loss_topic, "--json"))
    assert one["topics"] == [_rest(live, f"/v1/topics/{w.loss_topic}")]


def test_version_is_the_package_version() -> None:
    proc = subprocess.run(
        metasrv_argv("--version"), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"metasrv {version('metasrv')}\n"
