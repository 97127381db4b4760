"""The demo's phases, in order (`PHASES`; on the cluster `phases()` adds the broker kill).

Each phase is a function of the run; a live one streams the topic table while datanodes
write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from toolbox.demo._config import PRUNE_INTERVAL, STAT_TTL, DemoOptions, DemoServices, demo_config
from toolbox.demo._context import DemoRun
from toolbox.demo._report import Watcher, recovery_table
from toolbox.simulator import Workload, WorkloadConfig, migrate
from toolbox.stack import cluster_up, ensure_up


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
