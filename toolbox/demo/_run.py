"""`metasrv demo`: the main job end to end on the local real services, with simulated datanodes.

The demo is the list `PHASES`, numbered by its order: bring the stack up (Kafka, etcd,
PostgreSQL), migrate the history database, start a `metasrv start` child on etcd + PostgreSQL
with short intervals, run simulated datanodes writing real WAL records while the ticker purges
and manual purges are submitted, kill one datanode (its topics must stop being purged), restart
it (every acknowledged row must come back), then crash-restart every datanode for a final check.
Exit status 1 when any acknowledged row is missing, Kafka lost an entry a region needed, or the
metasrv died. Child processes are stopped at the end; the stack keeps running.

With `cluster` (`metasrv demo --cluster`) it runs on the production-shaped cluster instead
(`toolbox.stack.cluster_up`: three Kafka brokers, topics at replication factor 3 with
`min.insync.replicas` 2, a 3-member etcd), and one more phase SIGKILLs the broker that
leads a WAL topic's partition while datanodes write and purges run, then restarts it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.panel import Panel

from metasrv import wire
from metasrv.errors import MetasrvError, WalDataLoss
from metasrv.kafka import KafkaAdmin
from metasrv.wire import MetasrvClient
from toolbox.demo._report import Findings, Watcher, failure_text, recovery_table, summary_table
from toolbox.simulator import (
    MetasrvProcess,
    Workload,
    WorkloadConfig,
    free_port,
    migrate,
    render_config,
)
from toolbox.stack import Cluster, cluster_up, ensure_up

logger = logging.getLogger(__name__)

NUM_TOPICS = 4
STAT_TTL = 10.0
PRUNE_INTERVAL = 10.0


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What the demo runs."""

    nodes: int = 3
    regions_per_node: int = 8
    write_rate: float = 200.0
    """Rows per second over all regions."""
    phase_seconds: float = 30.0
    """Length of each writing phase (there are two, plus the outage)."""
    seed: int = 7
    keep_running: bool = False
    """Leave metasrv and the datanodes running until Ctrl-C."""
    run_dir: Path | None = None
    """Where config, logs and datanode data go (default: a new temp dir)."""
    cluster: bool = False
    """Run on the 3-broker, 3-member cluster and kill a partition leader while purging."""


@dataclass(frozen=True, slots=True)
class DemoServices:
    """Where the demo's metasrv and datanodes find Kafka, etcd and PostgreSQL."""

    kafka_bootstrap: str
    """Every broker, comma-separated."""
    etcd_endpoints: list[str]
    postgres_url: str
    replication_factor: int = 1


def demo_config(services: DemoServices, *, run_id: str, port: int, tokens: dict[str, str]) -> str:
    """The demo's metasrv config: etcd kv under a unique prefix, PostgreSQL history."""
    durability: dict[str, object] = {}
    if services.replication_factor > 1:
        durability = {
            "replication_factor": services.replication_factor,
            "min_insync_replicas": 2,
        }
    return render_config(
        {
            "wal": {
                "broker_endpoints": services.kafka_bootstrap.split(","),
                **durability,
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
                "etcd_endpoints": services.etcd_endpoints,
                "key_prefix": f"/metasrv-demo/{run_id}/",
            },
            "history": {"url": services.postgres_url},
            "auth": {
                "datanode_tokens": [tokens["datanode"]],
                "operator_tokens": [tokens["operator"]],
                "viewer_tokens": [tokens["viewer"]],
                "open_read": True,
            },
            "election": {"lease_secs": 5, "node_name": f"demo-{run_id}"},
        }
    )


class DemoRun:
    """One demo run: what the phases share."""

    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.run_id = secrets.token_hex(3)
        self.run_dir = options.run_dir or Path(
            tempfile.mkdtemp(prefix=f"metasrv-demo-{self.run_id}-")
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tokens = {r: secrets.token_urlsafe(16) for r in ("datanode", "operator", "viewer")}
        self.findings = Findings()
        self.victim = 1 % options.nodes
        self.url = f"http://127.0.0.1:{free_port()}"
        self.operator = MetasrvClient(self.url, token=self.tokens["operator"], timeout=15.0)
        self.viewer = MetasrvClient(self.url, token=self.tokens["viewer"], timeout=15.0)
        self.config = self.run_dir / "metasrv.toml"
        self.metasrv = MetasrvProcess(self.config, self.run_dir / "metasrv.log", self.url)
        self._services: DemoServices | None = None
        self.cluster: Cluster | None = None
        self._workload: Workload | None = None
        self._watcher: Watcher | None = None

    @property
    def services(self) -> DemoServices:
        assert self._services is not None, "the services phase runs first"
        return self._services

    @property
    def workload(self) -> Workload:
        assert self._workload is not None, "the datanodes phase runs first"
        return self._workload

    @property
    def watcher(self) -> Watcher:
        assert self._watcher is not None, "the datanodes phase runs first"
        return self._watcher

    def purge_and_wait(self) -> list[str]:
        """Submit a manual purge of every topic; count the final states; one line per topic."""
        lines = []
        for info in self.operator.wait(self.operator.purge(), timeout=120):
            states = self.findings.procedures
            states[info.state] = states.get(info.state, 0) + 1
            outcome = f" — {info.outcome}" if info.outcome else ""
            lines.append(f"{info.topic}: {info.state}{outcome}")
        return lines

    def write_live(self, title: str, seconds: float) -> None:
        """Let the datanodes write for `seconds`, showing the topic table as it changes."""
        watcher = self.watcher
        watcher.phase = title
        with Live(watcher.table(), console=self.console, refresh_per_second=2) as live:

            def tick(elapsed: float) -> None:
                watcher.tick(elapsed)
                watcher.phase = f"{title} ({elapsed:.0f}/{seconds:.0f}s)"
                live.update(watcher.table())
                if not self.metasrv.alive():
                    raise MetasrvError(f"metasrv exited:\n{self.metasrv.tail()}")

            self.workload.run(seconds, tick=tick)
        if not self.console.is_terminal:
            self.console.line()  # off a terminal the live table leaves no line break behind

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        if self._workload is not None:
            self._workload.close()
        self.operator.close()
        self.viewer.close()
        self.metasrv.stop()
        if self.cluster is not None:
            self.cluster.heal()
        if self._services is not None:
            _delete_topics(self._services.kafka_bootstrap, f"demo_{self.run_id}_")


# --- the phases, in order --------------------------------------------------------------------


def start_services(run: DemoRun) -> None:
    single = ensure_up()  # PostgreSQL (and, without --cluster, Kafka and etcd)
    if run.options.cluster:
        run.cluster = cluster_up()
        run._services = DemoServices(
            kafka_bootstrap=run.cluster.kafka_bootstrap,
            etcd_endpoints=run.cluster.etcd_endpoints,
            postgres_url=single.postgres_url,
            replication_factor=3,
        )
    else:
        run._services = DemoServices(
            kafka_bootstrap=single.kafka_bootstrap,
            etcd_endpoints=[single.etcd_endpoint],
            postgres_url=single.postgres_url,
        )
    s = run.services
    run.console.print(
        f"   Kafka {s.kafka_bootstrap} (replication factor {s.replication_factor}), "
        f"etcd {','.join(s.etcd_endpoints)}, PostgreSQL {s.postgres_url.split('@')[-1]}"
    )


def migrate_history(run: DemoRun) -> None:
    port = int(run.url.rsplit(":", 1)[1])
    run.config.write_text(
        demo_config(run.services, run_id=run.run_id, port=port, tokens=run.tokens)
    )
    migrate(run.config, run.run_dir / "db-upgrade.log")


def start_metasrv(run: DemoRun) -> None:
    run.metasrv.start()


def start_datanodes(run: DemoRun) -> None:
    options = run.options
    run._workload = Workload(
        WorkloadConfig(
            nodes=options.nodes,
            regions_per_node=options.regions_per_node,
            write_rate=options.write_rate,
            seed=options.seed,
            heartbeat_interval=1.0,
            flush_threshold_bytes=48 * 1024,
        ),
        kafka_bootstrap=run.services.kafka_bootstrap,
        data_dir=run.run_dir / "datanodes",
        metasrv_url=run.url,
        operator_token=run.tokens["operator"],
        datanode_token=run.tokens["datanode"],
    )
    run.workload.setup()
    run.workload.start()
    run._watcher = Watcher(run.workload, run.viewer, run.findings)
    kinds: dict[str, int] = {}
    for plan in run.workload.plans:
        kinds[plan.kind.value] = kinds.get(plan.kind.value, 0) + 1
    run.console.print(
        f"   regions: {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))} "
        "(slow regions flush only when the metasrv asks; idle ones never write)"
    )


def write_and_purge(run: DemoRun) -> None:
    run.write_live("writes + ticker purges", run.options.phase_seconds)
    lines = run.purge_and_wait()
    run.console.print(f"   manual purge: POST /v1/purge -> {len(lines)} procedures")
    for line in lines:
        run.console.print(f"     {line}")


def kill_partition_leader(run: DemoRun) -> None:
    cluster = run.cluster
    assert cluster is not None
    topic = run.workload.topics[0]
    victim = cluster.broker_of(cluster.partition_leader(topic))
    cluster.kill(victim)
    run.console.print(f"   SIGKILLed {victim}, the leader of {topic}'s partition")
    run.write_live(f"{victim} down", run.options.phase_seconds)
    lines = run.purge_and_wait()
    run.console.print(f"   purge with {victim} down: POST /v1/purge -> {len(lines)} procedures")
    for line in lines:
        run.console.print(f"     {line}")
    started = time.monotonic()
    cluster.start(victim)
    run.console.print(f"   restarted {victim} ({time.monotonic() - started:.1f}s to rejoin)")


def crash_datanode(run: DemoRun) -> None:
    run.workload.kill(run.victim)
    run.watcher.outage = True
    run.write_live(f"datanode {run.victim} down", STAT_TTL + 4)
    for line in run.purge_and_wait():
        run.console.print(f"     {line}")
    run.watcher.tick()
    run.watcher.outage = False
    blocked = sum(len(v) for v in run.findings.blocked_during_outage.values())
    run.console.print(
        f"   the plan named {blocked} stale regions as blockers "
        f"while datanode {run.victim} was down"
    )


def restart_datanode(run: DemoRun) -> None:
    recovery = run.workload.restart(run.victim)
    run.findings.recoveries.append(recovery)
    run.console.print(recovery_table([recovery]))


def write_again(run: DemoRun) -> None:
    run.write_live("writes + ticker purges", run.options.phase_seconds)


def verify_every_row(run: DemoRun) -> None:
    run.workload.stop_writes()
    time.sleep(2.0)  # one more heartbeat of every region
    run.purge_and_wait()
    run.watcher.tick()
    final = run.workload.verify_all()
    run.findings.recoveries.extend(final)
    run.console.print(recovery_table(final))


@dataclass(frozen=True, slots=True)
class Phase:
    """One numbered phase. A live phase prints a rule and streams the topic table; the others
    show a spinner and their duration."""

    title: Callable[[DemoRun], str]
    run: Callable[[DemoRun], None]
    live: bool = False


_BROKER_PHASE = Phase(
    lambda r: "Kill the Kafka broker leading a WAL partition while writing and purging",
    kill_partition_leader,
    live=True,
)

PHASES: tuple[Phase, ...] = (
    Phase(lambda r: "Local services (Kafka, etcd, PostgreSQL)", start_services),
    Phase(lambda r: "History database migrations (metasrv db upgrade)", migrate_history),
    Phase(lambda r: f"Start metasrv (etcd kv, PostgreSQL history) on {r.url}", start_metasrv),
    Phase(lambda r: "Register regions and start the simulated datanodes", start_datanodes),
    Phase(
        lambda r: f"Writing; the ticker purges every {PRUNE_INTERVAL:.0f}s",
        write_and_purge,
        live=True,
    ),
    Phase(
        lambda r: (
            f"Crash datanode {r.victim}: its regions go stale, their topics stop being purged"
        ),
        crash_datanode,
        live=True,
    ),
    Phase(
        lambda r: f"Restart datanode {r.victim}: replay from GET /v1/regions/{{id}}/replay-start",
        restart_datanode,
    ),
    Phase(
        lambda r: "Writing again; purges resume once every region reported",
        write_again,
        live=True,
    ),
    Phase(
        lambda r: "Final purge, then crash-restart every datanode and verify every row",
        verify_every_row,
    ),
)


def phases(options: DemoOptions) -> tuple[Phase, ...]:
    """The demo's phases: `PHASES`, and on the cluster the broker kill after the first
    writing phase."""
    if not options.cluster:
        return PHASES
    return (*PHASES[:5], _BROKER_PHASE, *PHASES[5:])


def _run_phase(run: DemoRun, number: int, total: int, phase: Phase) -> None:
    label = f"[bold]{number}/{total}[/bold] {phase.title(run)}"
    if phase.live:
        run.console.rule(label)
        phase.run(run)
        return
    started = time.monotonic()
    with run.console.status(f"{label}…"):
        phase.run(run)
    run.console.print(f"[green]✓[/green] {label} ({time.monotonic() - started:.1f}s)")


def _summarize(run: DemoRun) -> None:
    run.watcher.tick()
    history: dict[str, list[wire.PurgeRecord]] = {}
    for record in run.viewer.history(limit=1000):
        history.setdefault(record.topic, []).append(record)
    run.console.print(summary_table(run.workload.topics, run.watcher.plans, history, run.findings))
    states = ", ".join(f"{n} {s}" for s, n in sorted(run.findings.procedures.items()))
    run.console.print(f"manual purge procedures: {states}")
    run.console.print(f"dashboard: [link]{run.url}/dashboard[/link]   (metrics: {run.url}/metrics)")
    if run.options.keep_running:
        run.console.print(
            "[bold]--keep-running[/bold]: metasrv and the datanodes stay up; Ctrl-C to stop."
        )
        run.workload.start()
        with contextlib.suppress(KeyboardInterrupt):
            while run.metasrv.alive():
                time.sleep(1.0)
                run.watcher.tick()


def run_demo(options: DemoOptions, console: Console) -> int:
    """Run every phase, then the summary; return the exit status."""
    run = DemoRun(options, console)
    # Logs (the simulator's, librdkafka's) go to a file; the console shows the story.
    handler = logging.FileHandler(run.run_dir / "demo.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    console.print(
        Panel.fit(
            f"metasrv demo [bold]{run.run_id}[/bold]: {options.nodes} datanodes x "
            f"{options.regions_per_node} regions on {NUM_TOPICS} Kafka topics, "
            f"{options.write_rate:.0f} rows/s\nrun dir: {run.run_dir}",
            title="metasrv demo",
        )
    )
    try:
        chosen = phases(options)
        for number, phase in enumerate(chosen, start=1):
            _run_phase(run, number, len(chosen), phase)
        _summarize(run)
    except WalDataLoss as exc:
        run.findings.failure = f"WAL data loss: {exc.message}"
    except MetasrvError as exc:
        run.findings.failure = f"{exc.code}: {exc.message}"
    except KeyboardInterrupt:
        run.findings.failure = "interrupted"
    finally:
        run.close()
    logging.getLogger().removeHandler(handler)
    handler.close()
    if run.findings.ok:
        console.print(
            "[bold green]demo passed[/bold green]: every acknowledged row recovered, "
            "no needed WAL entry lost"
        )
        if options.run_dir is None:
            shutil.rmtree(run.run_dir, ignore_errors=True)
        return 0
    console.print()
    console.print(f"[bold red]demo FAILED[/bold red]: {failure_text(run.findings)}")
    console.print(f"logs: {run.run_dir}")
    return 1


def _delete_topics(bootstrap: str, prefix: str) -> None:
    """Remove the demo's topics (the stack is shared; don't leave data behind)."""
    admin = KafkaAdmin(bootstrap)
    try:
        admin.delete_topics(t for t in admin.list_topics() if t.startswith(prefix))
    except MetasrvError as exc:
        logger.warning("could not delete demo topics: %s", exc)
    finally:
        admin.close()
