"""`log_records`: the daemon's JSON log lines, by message prefix and stamp."""

from __future__ import annotations

import json
from pathlib import Path

from toolbox.simulator import log_records


def _line(ts: str, msg: str, **extra: object) -> str:
    return json.dumps({"ts": ts, "level": "info", "logger": "x", "msg": msg, **extra})


def test_log_records_keeps_the_lines_whose_message_starts_with_the_prefix(
    tmp_path: Path,
) -> None:
    log = tmp_path / "metasrv.log"
    log.write_text(
        "\n".join(
            [
                "plain text from a library",
                _line("2026-11-27T10:00:00.250Z", "elected leader", term=3),
                "{not json",
                _line("2026-11-27T10:00:01.000Z", "serving as leader"),
                _line("2026-11-27T10:00:02.000Z", "a line naming elected leader later"),
                json.dumps({"ts": "2026-11-27T10:00:03.000Z", "level": "info"}),
            ]
        )
    )
    found = log_records(log, "elected leader")
    assert [(at, record["term"]) for at, record in found] == [(1795773600.25, 3)]
    # No prefix: every JSON line, one without a message too.
    assert [r.get("msg") for _, r in log_records(log)] == [
        "elected leader",
        "serving as leader",
        "a line naming elected leader later",
        None,
    ]


def test_log_records_since_drops_earlier_lines_and_a_missing_log_is_empty(
    tmp_path: Path,
) -> None:
    log = tmp_path / "metasrv.log"
    log.write_text(
        "\n".join(
            [
                _line("2026-11-27T10:00:00.000Z", "leadership lost"),
                _line("2026-11-27T10:00:05.500Z", "leadership lost", reason="lease"),
            ]
        )
    )
    assert [r["reason"] for _, r in log_records(log, "leadership", since=1795773601.0)] == ["lease"]
    assert log_records(tmp_path / "absent.log", "") == []
