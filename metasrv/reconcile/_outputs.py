"""What a reconcile run leaves in the history database (`[history] url`): its row in
`reconcile_runs` and its most urgent findings, with what `--apply` did to each, in
`reconcile_findings`; and the apply step's part of the run's summary."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import sqlalchemy.exc as sa_exc
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url

from metasrv.errors import Unavailable
from metasrv.reconcile._apply import ActionResult, ApplyPlan, Outcome
from metasrv.reconcile._findings import Finding
from metasrv.reconcile._store import RunRecord, save_run, sql_error_detail
from metasrv.settings import Settings
from metasrv.sql import engine_url, migrate_embedded


def apply_summary(plan: ApplyPlan, results: list[ActionResult]) -> dict[str, Any]:
    """The summary's `apply` section: counts by outcome, the first 1,000 actions, skips."""
    return {
        "planned": len(plan.actions),
        "outcomes": {
            o.value: sum(1 for r in results if r.outcome is o) for o in Outcome if results
        },
        "actions": [
            {
                "action": r.action.kind.value,
                "topic": r.action.topic,
                "region_id": r.action.region_id,
                "outcome": r.outcome.value,
                "detail": r.detail,
            }
            for r in results[:1000]
        ],
        "skipped": dict(plan.skipped),
        "skipped_examples": {k: [list(x) for x in v] for k, v in plan.skipped_examples.items()},
    }


def _action_label(result: ActionResult) -> str:
    label = {
        "create_topic": "topic_created",
        "register_region": "registered",
        "drop_region": "dropped",
    }[result.action.kind.value]
    return label if result.outcome is Outcome.DONE else f"{label}:{result.outcome.value}"


def save_to_history(
    settings: Settings,
    run_id: str,
    started: datetime,
    summary: dict[str, Any],
    findings_path: str,
    results: list[ActionResult],
) -> None:
    """Save the run and its most urgent findings (each with what `--apply` did to it).

    Raises `Unavailable` naming the history database when it cannot be written.
    """
    cfg = settings.reconcile
    actions = {r.action.finding_key: _action_label(r) for r in results}
    url = settings.history.url
    try:
        engine = _history_engine(url)
    except sa_exc.SQLAlchemyError as exc:
        raise Unavailable(f"history database {make_url(url)!r} unreachable: {exc}") from exc
    try:
        save_run(
            engine,
            RunRecord(
                run_id=run_id,
                started_at=started,
                finished_at=datetime.now(UTC),
                status="succeeded",
                master=summary["master"],
                applied=summary["applied"],
                kv_revision=summary["inputs"]["kv_revision"],
                counts=summary["counts"],
                findings_total=summary["findings_total"],
                out_dir=str(Path(findings_path).parent),
                summary=summary,
            ),
            _iter_findings(findings_path),
            actions=actions,
            limit=cfg.sql_findings_limit,
            keep_runs=cfg.keep_runs,
        )
    except sa_exc.SQLAlchemyError as exc:
        raise Unavailable(
            f"could not save the run to the history database {make_url(url)!r}: "
            f"{sql_error_detail(exc)} "
            "(has `metasrv db upgrade` been run?)"
        ) from exc
    finally:
        engine.dispose()


def _history_engine(url: str) -> Engine:
    rendered = engine_url(url)
    migrate_embedded(rendered)  # a history file is migrated on first use, as the daemon does
    return create_engine(rendered)


def _iter_findings(findings_path: str) -> Iterator[Finding]:
    # The Spark job wrote one sorted file; batches keep driver memory flat.
    for batch in ds.dataset(findings_path, format="parquet").to_batches(batch_size=10_000):
        for row in batch.to_pylist():
            yield Finding.from_row(row)
