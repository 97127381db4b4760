"""`metasrv reconcile`: the Spark batch that finds (and with --apply repairs) inconsistencies.

Exit codes: 0 the run finished (findings or not; see the summary); 1 the Spark job failed
or an --apply action was refused; 2 bad configuration or arguments; 3 the kv backend,
Kafka, the Spark master, the history database or metasrv could not be reached.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from cli._connect import JsonOpt, connected, read_json
from cli._sheet import Output
from cli._tables import counts_sheet, findings_sheet
from metasrv import errors, wire
from metasrv.settings import is_url, parse_duration
from metasrv.wire import MetasrvClient

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)


class _RichProgress:
    """`metasrv.reconcile.Progress` on a rich progress display (one line per stage)."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: TaskID | None = None
        self._name = ""

    def stage(self, name: str, total: int | None = None) -> None:
        self._finish()
        self._name = name
        self._task = self._progress.add_task(name, total=total)

    def detail(self, text: str) -> None:
        if self._task is not None:
            label = f"{self._name} ({text})" if text else self._name
            self._progress.update(self._task, description=label)

    def advance(self, n: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)

    def _finish(self) -> None:
        if self._task is not None:
            task = self._progress.tasks[-1]
            self._progress.update(self._task, total=task.total or task.completed or 1)
            self._progress.update(self._task, completed=task.total)

    def close(self) -> None:
        self._finish()


def _duration(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from exc


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, errors.ConfigError | errors.InvalidArgument):
        return 2
    if isinstance(exc, errors.Unavailable | errors.Unauthenticated | errors.PermissionDenied):
        return 3
    return 1


reconcile_app = typer.Typer(
    help="Find regions mapped to the wrong topic, dropped regions still mapped, missing or "
    "orphaned topics, WAL data loss and skew, on Spark; with --apply, repair the safe ones. "
    "`metasrv reconcile latest` reads the newest run's findings from a running metasrv.",
    invoke_without_command=True,
    no_args_is_help=False,
)


@reconcile_app.callback()
def reconcile(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Option("-c", "--config", help="TOML config file (DESIGN §6).")
    ] = None,
    master: Annotated[
        str | None,
        typer.Option("--master", help="Spark master URL (default: config reconcile.spark_master)."),
    ] = None,
    apply: Annotated[
        bool,
        typer.Option("--apply", help="Repair the safe classes through metasrv's API."),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Output directory (default: config reconcile.out_dir)."),
    ] = None,
    drop_stale_after: Annotated[
        str | None,
        typer.Option(
            "--drop-stale-after",
            help="With --apply: drop regions with no stat for this long (e.g. 7d).",
        ),
    ] = None,
    stale_after: Annotated[
        str | None,
        typer.Option("--stale-after", help="Override config reconcile.stale_after (e.g. 30m)."),
    ] = None,
    history: Annotated[
        str | None,
        typer.Option(
            "--history",
            help="Override config history.stats_url (a path or s3://, hdfs:// URL); "
            "the cluster's own directory under it is read.",
        ),
    ] = None,
) -> None:
    """Run the reconcile job (the options below), or read the newest run (`latest`)."""
    if ctx.invoked_subcommand is not None:
        run_options = [master, out, drop_stale_after, stale_after, history, config]
        if apply or any(v is not None for v in run_options):
            raise typer.BadParameter(f"the run's options do not apply to {ctx.invoked_subcommand}")
        return
    from metasrv.reconcile import RunOptions, run_reconcile
    from metasrv.settings import load_settings

    drop_after = _duration(drop_stale_after, "--drop-stale-after")
    stale = _duration(stale_after, "--stale-after")
    if drop_after is not None and not apply:
        raise typer.BadParameter("only meaningful with --apply", param_hint="--drop-stale-after")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        overrides: dict[str, Any] = {}
        if stale is not None:
            overrides["reconcile"] = {"stale_after": stale}
        if history is not None:
            # Typed in this shell, so a relative path means this working directory.
            given = history if is_url(history) else str(Path(history).resolve())
            overrides["history"] = {"stats_url": given}
        settings = load_settings(config, **overrides)
        options = RunOptions(
            master=master or settings.reconcile.spark_master,
            out_dir=out or Path(settings.reconcile.out_dir),
            apply=apply,
            drop_stale_after=drop_after,
        )
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=_err, transient=False) as bar:
            sink = _RichProgress(bar)
            try:
                report = run_reconcile(settings, options, progress=sink)
            finally:
                sink.close()
    except errors.MetasrvError as exc:
        _err.print(f"error: {exc.message}", markup=False)
        raise typer.Exit(_exit_code(exc)) from None
    except Exception as exc:  # Py4J / Spark analysis errors: one line, no traceback
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _err.print(f"error: the Spark job failed: {first}", markup=False)
        raise typer.Exit(1) from None
    summary = report.summary
    # The job's report for a person; scripts read the run directory's summary.
    Output(terminal=True).show(counts_sheet(report.counts))
    for note in summary.get("notes", []):
        _out.print(f"note: {note}", markup=False)
    if apply:
        outcomes = summary.get("apply", {}).get("outcomes", {})
        _out.print(
            f"apply: {len(report.actions)} action(s): "
            + (", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()) if v) or "nothing to do"),
            markup=False,
        )
        for reason, n in sorted(summary.get("apply", {}).get("skipped", {}).items()):
            _out.print(f"apply: left {n} finding(s) alone: {reason}", markup=False)
    _out.print(f"run {report.run_id}: {report.run_dir}", markup=False)
    if report.failed_actions:
        raise typer.Exit(1)


@reconcile_app.command("latest")
@connected(write=False)
def latest(
    kind: Annotated[
        str | None, typer.Option("--kind", help="Only this finding kind (e.g. wrong_topic).")
    ] = None,
    severity: Annotated[
        str | None, typer.Option("--severity", help="Only critical, warning or info.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 100,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
    as_json: JsonOpt = False,
    *,
    client: MetasrvClient,
) -> None:
    """The newest reconcile run (read from metasrv) and its findings, most urgent first."""
    run, body = read_json(
        client,
        wire.ReconcileLatest,
        "/v1/reconcile/latest",
        kind=kind,
        severity=severity,
        limit=limit,
        offset=offset,
    )
    Output().emit(as_json, body, findings_sheet(run))


def register(app: typer.Typer) -> None:
    """Add `metasrv reconcile` (and `metasrv reconcile latest`) to the root app."""
    app.add_typer(reconcile_app, name="reconcile")
