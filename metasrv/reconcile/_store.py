"""Saving reconcile runs to SQL and reading the latest one back (for the API)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy.exc as sa_exc
from sqlalchemy import Engine, delete, func, insert, select

from metasrv.errors import NotFound, Unavailable
from metasrv.reconcile._findings import Finding
from metasrv.sql import reconcile_findings_table, reconcile_runs_table

logger = logging.getLogger(__name__)

_INSERT_CHUNK = 5000


def sql_error_detail(exc: BaseException) -> str:
    """The first line of a database error, as the driver said it (no SQL, no traceback)."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One reconcile run's row in `reconcile_runs`."""

    run_id: str
    """Unique id (also the name of its output directory)."""
    started_at: datetime
    """When the run began (UTC)."""
    finished_at: datetime
    """When it ended (UTC)."""
    status: str
    """"succeeded" or "failed"."""
    master: str
    """Spark master it ran on."""
    applied: bool
    """Whether `--apply` was given."""
    kv_revision: int | None
    """kv store revision of the snapshot."""
    counts: Mapping[str, Mapping[str, int]]
    """kind -> severity -> findings."""
    findings_total: int
    """Findings in the Parquet output."""
    out_dir: str | None
    """Where the Parquet and JSON summary are."""
    summary: Mapping[str, Any]


def save_run(
    engine: Engine,
    run: RunRecord,
    findings: Iterable[Finding],
    *,
    actions: Mapping[tuple[str, str | None, int | None], str] | None = None,
    limit: int,
    keep_runs: int,
) -> int:
    """Insert the run and up to `limit` findings (callers pass the most urgent first).

    `actions` maps a finding key to what `--apply` did about it. Runs beyond the newest
    `keep_runs` are deleted with their findings. Returns the findings stored.
    """
    acted = actions or {}
    stored = 0
    with engine.begin() as conn:
        conn.execute(
            insert(reconcile_runs_table).values(
                run_id=run.run_id,
                started_at=run.started_at,
                finished_at=run.finished_at,
                status=run.status,
                master=run.master,
                applied=run.applied,
                kv_revision=run.kv_revision,
                counts={k: dict(v) for k, v in run.counts.items()},
                findings_total=run.findings_total,
                findings_stored=0,
                out_dir=run.out_dir,
                summary=dict(run.summary),
            )
        )
        batch: list[dict[str, Any]] = []
        for f in findings:
            if stored >= limit:
                break
            batch.append(
                {
                    "run_id": run.run_id,
                    "kind": f.kind.value,
                    "severity": f.severity.value,
                    "topic": f.topic,
                    "region_id": f.region_id,
                    "message": f.message,
                    "evidence": f.evidence,
                    "action": acted.get(f.key),
                }
            )
            stored += 1
            if len(batch) >= _INSERT_CHUNK:
                conn.execute(insert(reconcile_findings_table), batch)
                batch = []
        if batch:
            conn.execute(insert(reconcile_findings_table), batch)
        conn.execute(
            reconcile_runs_table.update()
            .where(reconcile_runs_table.c.run_id == run.run_id)
            .values(findings_stored=stored)
        )
        old = [
            r[0]
            for r in conn.execute(
                select(reconcile_runs_table.c.run_id)
                .order_by(reconcile_runs_table.c.finished_at.desc())
                .offset(keep_runs)
            )
        ]
        if old:
            # Explicit: SQLite enforces ON DELETE CASCADE only with a pragma.
            conn.execute(
                delete(reconcile_findings_table).where(reconcile_findings_table.c.run_id.in_(old))
            )
            conn.execute(delete(reconcile_runs_table).where(reconcile_runs_table.c.run_id.in_(old)))
    return stored


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def latest_run(
    engine: Engine,
    *,
    kind: str | None = None,
    severity: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> dict[str, Any]:
    """The newest run with a page of its stored findings, most urgent first.

    Raises `NotFound` when no run was ever saved.
    """
    try:
        return _latest_run(engine, kind, severity, limit, offset)
    except sa_exc.SQLAlchemyError as exc:
        # The driver's message names the server and the user: logged, not answered.
        logger.warning("reading reconcile runs failed: %s", sql_error_detail(exc))
        raise Unavailable(
            "cannot read reconcile runs from the history database "
            "(is it reachable, and has `metasrv db upgrade` been run?)"
        ) from exc


def _latest_run(
    engine: Engine, kind: str | None, severity: str | None, limit: int, offset: int
) -> dict[str, Any]:
    runs, findings = reconcile_runs_table, reconcile_findings_table
    with engine.connect() as conn:
        run = conn.execute(
            select(runs).order_by(runs.c.finished_at.desc(), runs.c.run_id.desc()).limit(1)
        ).first()
        if run is None:
            raise NotFound("no reconcile run has been recorded yet (run `metasrv reconcile`)")
        cond = findings.c.run_id == run.run_id
        if kind is not None:
            cond = cond & (findings.c.kind == kind)
        if severity is not None:
            cond = cond & (findings.c.severity == severity)
        count = select(func.count()).select_from(findings).where(cond)
        matched = int(conn.execute(count).scalar_one())
        rows = conn.execute(
            select(findings).where(cond).order_by(findings.c.id).limit(limit).offset(offset)
        ).all()
    return {
        "run": {
            "run_id": run.run_id,
            "started_at": _iso(run.started_at),
            "finished_at": _iso(run.finished_at),
            "status": run.status,
            "master": run.master,
            "applied": run.applied,
            "kv_revision": run.kv_revision,
            "counts": run.counts,
            "findings_total": run.findings_total,
            "findings_stored": run.findings_stored,
            "out_dir": run.out_dir,
            "summary": run.summary,
        },
        "findings": [
            {
                "kind": r.kind,
                "severity": r.severity,
                "topic": r.topic,
                "region_id": r.region_id,
                "message": r.message,
                "evidence": r.evidence,
                "action": r.action,
            }
            for r in rows
        ],
        "matched": matched,
        "limit": limit,
        "offset": offset,
    }
