"""`metasrv demo`: the main job end to end on the local real services, with simulated datanodes.

Brings the stack up (Kafka, etcd, PostgreSQL), migrates the history database, starts a
`metasrv start` child on etcd + PostgreSQL with short intervals, runs simulated datanodes
writing real WAL records, lets the ticker purge and submits manual purges, kills one
datanode (its topics must stop being purged) and restarts it (every acknowledged row must
come back), then crash-restarts every datanode for a final check and prints a summary.
Exit status 1 when any acknowledged row is missing, Kafka lost an entry a region needed,
or the metasrv died. Child processes are stopped at the end; the stack keeps running.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from metasrv.client import MetasrvClient, PurgeRecord
from metasrv.errors import MetasrvError, WalDataLoss
from metasrv.kafka import KafkaAdmin
from metasrv.model import TopicPlan
from metasrv.simulator import (
    MetasrvProcess,
    NodeRecovery,
    Workload,
    WorkloadConfig,
    free_port,
    migrate,
    render_config,
)

logger = logging.getLogger(__name__)

NUM_TOPICS = 4
STAT_TTL = 10.0
PRUNE_INTERVAL = 10.0


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What the demo runs."""

    nodes: int = 3
    """Simulated datanodes."""
    regions_per_node: int = 8
    """Regions on each datanode."""
    write_rate: float = 200.0
    """Rows per second over all regions."""
    phase_seconds: float = 30.0
    """Length of each writing phase (there are two, plus the outage)."""
    seed: int = 7
    """Workload seed."""
    keep_running: bool = False
    """Leave metasrv and the datanodes running until Ctrl-C."""
    run_dir: Path | None = None
    """Where config, logs and datanode data go (default: a new temp dir)."""


@dataclass(slots=True)
class _Findings:
    """What the demo observed; decides the exit status."""

    recoveries: list[NodeRecovery] = field(default_factory=list)
    lost_entries: dict[str, int] = field(default_factory=dict)
    """Topic -> unflushed acknowledged entries found below Kafka's log start."""
    data_loss_reported: set[str] = field(default_factory=set)
    """Topics whose plan reported WAL data loss."""
    blocked_during_outage: dict[str, set[int]] = field(default_factory=dict)
    procedures: dict[str, int] = field(default_factory=dict)
    """Procedure states counted over the manual purges."""
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.failure is None
            and not self.lost_entries
            and not self.data_loss_reported
            and all(r.missing == 0 for r in self.recoveries)
        )


# --- config ---------------------------------------------------------------------------------


def demo_config(
    *, kafka: str, etcd: str, postgres_url: str, run_id: str, port: int, tokens: dict[str, str]
) -> str:
    """The demo's metasrv config: etcd kv under a unique prefix, PostgreSQL history."""
    return render_config(
        {
            "wal": {
                "broker_endpoints": [kafka],
                "num_topics": NUM_TOPICS,
                "topic_name_prefix": f"demo_{run_id}",
                "auto_prune_interval": f"{PRUNE_INTERVAL:.0f}s",
                "region_stat_ttl": f"{STAT_TTL:.0f}s",
                "flush_trigger_size": "256KB",
                "flush_wait_timeout": "10s",
                "checkpoint_interval": "2s",
            },
            "procedure": {"retry_delay": "200ms"},
            "http": {"addr": f"127.0.0.1:{port}"},
            "kv": {
                "backend": "etcd",
                "etcd_endpoints": [etcd],
                "key_prefix": f"/metasrv-demo/{run_id}/",
            },
            "history": {"url": postgres_url},
            "auth": {
                "datanode_tokens": [tokens["datanode"]],
                "operator_tokens": [tokens["operator"]],
                "viewer_tokens": [tokens["viewer"]],
                "open_read": True,
            },
            "election": {"lease_secs": 5, "node_name": f"demo-{run_id}"},
        }
    )


# --- watching ------------------------------------------------------------------------------


class _Watcher:
    """Samples the plan and Kafka each tick; checks no needed entry was deleted."""

    def __init__(self, workload: Workload, viewer: MetasrvClient, findings: _Findings) -> None:
        self.workload = workload
        self.viewer = viewer
        self.findings = findings
        self.admin = KafkaAdmin(workload.kafka_bootstrap)
        self.plans: dict[str, TopicPlan] = {}
        self.purges: dict[str, int] = {}
        self.outage = False
        self.phase = ""

    def close(self) -> None:
        self.admin.close()

    def check_needed_entries(self) -> None:
        """Every acknowledged, unflushed row must still be readable from Kafka."""
        # Log start first, then the regions: a row needed after the read was needed before.
        offsets = self.admin.offsets(self.workload.topics)
        for datanode in self.workload.datanodes.values():
            for region in list(datanode.regions.values()):
                lost = [
                    e
                    for e in region.unflushed_entry_ids()
                    if e < offsets[region.topic].log_start_offset
                ]
                if lost:
                    self.findings.lost_entries[region.topic] = self.findings.lost_entries.get(
                        region.topic, 0
                    ) + len(lost)

    def tick(self, _elapsed: float = 0.0) -> None:
        self.check_needed_entries()
        with contextlib.suppress(MetasrvError):
            self.plans = {p.topic: p for p in self.viewer.plan()}
        for plan in self.plans.values():
            if plan.data_loss:
                self.findings.data_loss_reported.add(plan.topic)
            if self.outage and plan.blocked_by:
                self.findings.blocked_during_outage.setdefault(plan.topic, set()).update(
                    b.region_id for b in plan.blocked_by
                )

    def table(self) -> Table:
        table = Table(title=f"WAL topics — {self.phase}", title_justify="left")
        table.add_column("topic")
        for column in ("regions", "HW", "log start", "P", "pruned", "reclaimable"):
            table.add_column(column, justify="right")
        table.add_column("blocked by")
        for topic in self.workload.topics:
            plan = self.plans.get(topic)
            if plan is None:
                table.add_row(topic, *["-"] * 7)
                continue
            reasons: dict[str, int] = {}
            for b in plan.blocked_by:
                reasons[b.reason] = reasons.get(b.reason, 0) + 1
            blocked = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
            table.add_row(
                topic,
                str(plan.region_count),
                _num(plan.high_watermark),
                _num(plan.log_start_offset),
                _num(plan.prune_point),
                _num(plan.pruned_entry_id),
                str(plan.reclaimable_entries),
                f"[yellow]{blocked}[/yellow]" if blocked else "[green]none[/green]",
            )
        return table


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


# --- the demo ------------------------------------------------------------------------------


@contextlib.contextmanager
def _step(console: Console, number: int, total: int, text: str) -> Iterator[None]:
    started = time.monotonic()
    with console.status(f"[bold]{number}/{total}[/bold] {text}…"):
        yield
    console.print(
        f"[green]✓[/green] [bold]{number}/{total}[/bold] {text} ({time.monotonic() - started:.1f}s)"
    )


def _wait_procedures(operator: MetasrvClient, ids: list[str], findings: _Findings) -> list[str]:
    lines = []
    for info in operator.wait(ids, timeout=120):
        findings.procedures[info.state] = findings.procedures.get(info.state, 0) + 1
        lines.append(f"{info.topic}: {info.state}" + (f" — {info.outcome}" if info.outcome else ""))
    return lines


def _recovery_table(recoveries: list[NodeRecovery]) -> Table:
    table = Table(
        title="Crash recovery (kill, then replay from the metasrv's replay-start)",
        title_justify="left",
    )
    for column in (
        "datanode",
        "regions",
        "acknowledged rows",
        "from SST",
        "replayed from Kafka",
        "missing",
    ):
        table.add_column(column, justify="right")
    for rec in recoveries:
        missing = f"[red]{rec.missing}[/red]" if rec.missing else "[green]0[/green]"
        table.add_row(
            str(rec.node_id),
            str(len(rec.verifications)),
            str(rec.acknowledged),
            str(rec.recovered_from_sst),
            str(rec.replayed),
            missing,
        )
    return table


def _summary_table(
    topics: list[str],
    plans: dict[str, TopicPlan],
    history: dict[str, list[PurgeRecord]],
    findings: _Findings,
) -> Table:
    table = Table(title="WAL purge summary", title_justify="left")
    table.add_column("topic")
    for column in ("P (pruned)", "HW", "purges", "deleted", "reclaimed"):
        table.add_column(column, justify="right")
    for column in ("blocked now", "blocked in outage", "needed lost"):
        table.add_column(column, justify="right")
    for topic in topics:
        plan = plans.get(topic)
        records = history.get(topic, [])
        lost = findings.lost_entries.get(topic, 0) + (
            1 if topic in findings.data_loss_reported else 0
        )
        table.add_row(
            topic,
            _num(plan.pruned_entry_id if plan else None),
            _num(plan.high_watermark if plan else None),
            str(len(records)),
            str(sum(r.entries_deleted for r in records)),
            _bytes(sum(r.bytes_estimated for r in records)),
            str(len(plan.blocked_by)) if plan else "-",
            str(len(findings.blocked_during_outage.get(topic, set()))),
            f"[red]{lost}[/red]" if lost else "[green]0[/green]",
        )
    return table


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def run_demo(options: DemoOptions, console: Console) -> int:
    """Run the whole demo; return the exit status."""
    from metasrv.stack import ensure_up

    total = 8
    run_id = secrets.token_hex(3)
    run_dir = options.run_dir or Path(tempfile.mkdtemp(prefix=f"metasrv-demo-{run_id}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    # Logs (the simulator's, librdkafka's) go to a file; the console shows the story.
    handler = logging.FileHandler(run_dir / "demo.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    tokens = {role: secrets.token_urlsafe(16) for role in ("datanode", "operator", "viewer")}
    findings = _Findings()
    console.print(
        Panel.fit(
            f"metasrv demo [bold]{run_id}[/bold]: {options.nodes} datanodes x "
            f"{options.regions_per_node} regions on {NUM_TOPICS} Kafka topics, "
            f"{options.write_rate:.0f} rows/s\nrun dir: {run_dir}",
            title="metasrv demo",
        )
    )

    with _step(console, 1, total, "Local services (Kafka, etcd, PostgreSQL)"):
        endpoints = ensure_up()
    console.print(
        f"   Kafka {endpoints.kafka_bootstrap}, etcd {endpoints.etcd_endpoint}, "
        f"PostgreSQL {endpoints.postgres_url.split('@')[-1]}"
    )

    port = free_port()
    config = run_dir / "metasrv.toml"
    config.write_text(
        demo_config(
            kafka=endpoints.kafka_bootstrap,
            etcd=endpoints.etcd_endpoint,
            postgres_url=endpoints.postgres_url,
            run_id=run_id,
            port=port,
            tokens=tokens,
        )
    )
    url = f"http://127.0.0.1:{port}"
    with _step(console, 2, total, "History database migrations (metasrv db upgrade)"):
        try:
            migrate(config, run_dir / "db-upgrade.log")
        except MetasrvError as exc:
            console.print(f"[red]{exc.message}[/red]")
            return 1

    metasrv = MetasrvProcess(config, run_dir / "metasrv.log", url)
    workload: Workload | None = None
    watcher: _Watcher | None = None
    operator = MetasrvClient(url, token=tokens["operator"], timeout=15.0)
    viewer = MetasrvClient(url, token=tokens["viewer"], timeout=15.0)
    try:
        with _step(console, 3, total, f"Start metasrv (etcd kv, PostgreSQL history) on {url}"):
            metasrv.start()

        workload = Workload(
            WorkloadConfig(
                nodes=options.nodes,
                regions_per_node=options.regions_per_node,
                write_rate=options.write_rate,
                seed=options.seed,
                heartbeat_interval=1.0,
                flush_threshold_bytes=48 * 1024,
            ),
            kafka_bootstrap=endpoints.kafka_bootstrap,
            data_dir=run_dir / "datanodes",
            metasrv_url=url,
            operator_token=tokens["operator"],
            datanode_token=tokens["datanode"],
        )
        with _step(console, 4, total, "Register regions and start the simulated datanodes"):
            workload.setup()
            workload.start()
        watcher = _Watcher(workload, viewer, findings)
        kinds = {
            k.value: sum(1 for p in workload.plans if p.kind is k)
            for k in {p.kind for p in workload.plans}
        }
        console.print(
            f"   regions: {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))} "
            "(slow regions flush only when the metasrv asks; idle ones never write)"
        )

        def live_phase(title: str, seconds: float) -> None:
            assert watcher is not None and workload is not None
            watcher.phase = title
            with Live(
                watcher.table(), console=console, refresh_per_second=2, transient=False
            ) as live:

                def tick(elapsed: float) -> None:
                    assert watcher is not None
                    watcher.tick(elapsed)
                    watcher.phase = f"{title} ({elapsed:.0f}/{seconds:.0f}s)"
                    live.update(watcher.table())
                    if not metasrv.alive():
                        raise MetasrvError(f"metasrv exited:\n{metasrv.tail()}")

                workload.run(seconds, tick=tick)
            if not console.is_terminal:
                console.line()  # off a terminal the live table leaves no line break behind

        console.rule(
            f"[bold]5/{total}[/bold] Writing; the ticker purges every {PRUNE_INTERVAL:.0f}s"
        )
        live_phase("writes + ticker purges", options.phase_seconds)
        ids = operator.purge()
        console.print(f"   manual purge: POST /v1/purge -> {len(ids)} procedures")
        for line in _wait_procedures(operator, ids, findings):
            console.print(f"     {line}")

        victim = 1 % options.nodes
        console.rule(
            f"[bold]6/{total}[/bold] Crash datanode {victim}: its regions go stale, "
            "their topics stop being purged"
        )
        workload.kill(victim)
        watcher.outage = True
        live_phase(f"datanode {victim} down", STAT_TTL + 4)
        ids = operator.purge()
        for line in _wait_procedures(operator, ids, findings):
            console.print(f"     {line}")
        watcher.tick()
        watcher.outage = False
        blocked = sum(len(v) for v in findings.blocked_during_outage.values())
        console.print(
            f"   the plan named {blocked} stale regions as blockers "
            f"while datanode {victim} was down"
        )
        with _step(
            console,
            6,
            total,
            f"Restart datanode {victim}: replay from GET /v1/regions/{{id}}/replay-start",
        ):
            recovery = workload.restart(victim)
        findings.recoveries.append(recovery)
        console.print(_recovery_table([recovery]))

        console.rule(
            f"[bold]7/{total}[/bold] Writing again; purges resume once every region reported"
        )
        live_phase("writes + ticker purges", options.phase_seconds)

        with _step(
            console, 8, total, "Final purge, then crash-restart every datanode and verify every row"
        ):
            workload.stop_writes()
            time.sleep(2.0)  # one more heartbeat of every region
            ids = operator.purge()
            _wait_procedures(operator, ids, findings)
            watcher.tick()
            final = workload.verify_all()
        findings.recoveries.extend(final)
        console.print(_recovery_table(final))
        watcher.tick()
        history: dict[str, list[PurgeRecord]] = {}
        for record in viewer.history(limit=1000):
            history.setdefault(record.topic, []).append(record)
        console.print(_summary_table(workload.topics, watcher.plans, history, findings))
        states = ", ".join(f"{n} {s}" for s, n in sorted(findings.procedures.items()))
        console.print(f"manual purge procedures: {states}")
        console.print(f"dashboard: [link]{url}/dashboard[/link]   (metrics: {url}/metrics)")
        if options.keep_running:
            console.print(
                "[bold]--keep-running[/bold]: metasrv and the datanodes stay up; Ctrl-C to stop."
            )
            workload.start()
            with contextlib.suppress(KeyboardInterrupt):
                while metasrv.alive():
                    time.sleep(1.0)
                    watcher.tick()
    except WalDataLoss as exc:
        findings.failure = f"WAL data loss: {exc.message}"
    except MetasrvError as exc:
        findings.failure = f"{exc.code}: {exc.message}"
    except KeyboardInterrupt:
        findings.failure = "interrupted"
    finally:
        if watcher is not None:
            watcher.close()
        if workload is not None:
            workload.close()
        operator.close()
        viewer.close()
        metasrv.stop()
        _delete_topics(endpoints.kafka_bootstrap, f"demo_{run_id}_")
    logging.getLogger().removeHandler(handler)
    handler.close()
    if findings.ok:
        console.print(
            "[bold green]demo passed[/bold green]: every acknowledged row recovered, "
            "no needed WAL entry lost"
        )
        if options.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
        return 0
    console.print()
    console.print(f"[bold red]demo FAILED[/bold red]: {_failure_text(findings)}")
    console.print(f"logs: {run_dir}")
    return 1


def _failure_text(findings: _Findings) -> str:
    parts = []
    if findings.failure:
        parts.append(findings.failure)
    missing = sum(r.missing for r in findings.recoveries)
    if missing:
        parts.append(f"{missing} acknowledged rows missing after recovery")
    if findings.lost_entries:
        parts.append(f"needed entries deleted from Kafka: {findings.lost_entries}")
    if findings.data_loss_reported:
        parts.append(f"metasrv reported WAL data loss on {sorted(findings.data_loss_reported)}")
    return "; ".join(parts)


def _delete_topics(bootstrap: str, prefix: str) -> None:
    """Remove the demo's topics (the stack is shared; don't leave data behind)."""
    admin = KafkaAdmin(bootstrap)
    try:
        admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
    except MetasrvError as exc:
        logger.warning("could not delete demo topics: %s", exc)
    finally:
        admin.close()


def register(app: typer.Typer) -> None:
    """Add `metasrv demo` to the root app."""

    @app.command("demo")
    def demo(
        keep_running: Annotated[
            bool,
            typer.Option("--keep-running", help="Leave metasrv up afterwards (Ctrl-C stops it)."),
        ] = False,
        nodes: Annotated[int, typer.Option(min=1, help="Simulated datanodes.")] = 3,
        regions_per_node: Annotated[int, typer.Option(min=1, help="Regions per datanode.")] = 8,
        write_rate: Annotated[
            float, typer.Option(min=1.0, help="Rows per second in total.")
        ] = 200.0,
        phase_seconds: Annotated[
            float, typer.Option(min=5.0, help="Seconds per writing phase.")
        ] = 30.0,
        seed: Annotated[int, typer.Option(help="Workload seed.")] = 7,
        run_dir: Annotated[
            Path | None, typer.Option(help="Directory for config, logs, datanode data.")
        ] = None,
    ) -> None:
        """Run the WAL purge end to end on local Kafka/etcd/PostgreSQL with simulated datanodes."""
        options = DemoOptions(
            nodes=nodes,
            regions_per_node=regions_per_node,
            write_rate=write_rate,
            phase_seconds=phase_seconds,
            seed=seed,
            keep_running=keep_running,
            run_dir=run_dir,
        )
        # Piped output gets room for the tables (rich assumes 80 columns off a terminal).
        console = Console(width=None if sys.stdout.isatty() else 120)
        raise typer.Exit(run_demo(options, console))
