"""The demo's phases, in order (`PHASES`; on the cluster `phases()` adds the broker kill).

Each phase is a function of the run; a live one streams the topic table while datanodes
write.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from metasrv.archive import ArchivedRange, ObjectStore, covering, parse_object_key, topic_prefix
from metasrv.errors import InvalidArgument, MetasrvError
from toolbox.demo._config import (
    ARCHIVE_DELAY,
    PRUNE_INTERVAL,
    STAT_TTL,
    DemoOptions,
    DemoServices,
    archiver_config,
    demo_config,
)
from toolbox.demo._context import DemoRun
from toolbox.demo._report import Trim, Watcher, from_archive, recovery_table
from toolbox.simulator import RegionKind, Workload, WorkloadConfig, migrate
from toolbox.stack import cluster_up, ensure_up


def start_services(run: DemoRun) -> None:
    # PostgreSQL and the S3 server (and, without --cluster, Kafka and etcd).
    single = ensure_up(s3=True)
    assert single.s3 is not None
    if run.options.cluster:
        run.cluster = cluster_up()
        run._services = DemoServices(
            kafka_bootstrap=run.cluster.kafka_bootstrap,
            etcd_endpoints=run.cluster.etcd_endpoints,
            postgres_url=single.postgres_url,
            s3=single.s3,
            replication_factor=3,
        )
    else:
        run._services = DemoServices(
            kafka_bootstrap=single.kafka_bootstrap,
            etcd_endpoints=[single.etcd_endpoint],
            postgres_url=single.postgres_url,
            s3=single.s3,
        )
    s = run.services
    run.console.print(
        f"   Kafka {s.kafka_bootstrap} (replication factor {s.replication_factor}), "
        f"etcd {','.join(s.etcd_endpoints)}, PostgreSQL {s.postgres_url.split('@')[-1]}, "
        f"S3 {s.s3.endpoint} (bucket {s.s3.bucket})"
    )


def migrate_history(run: DemoRun) -> None:
    port = int(run.url.rsplit(":", 1)[1])
    run.config.write_text(
        demo_config(run.services, run_id=run.run_id, port=port, tokens=run.tokens)
    )
    migrate(run.config, run.run_dir / "db-upgrade.log")


def start_metasrv(run: DemoRun) -> None:
    run.metasrv.start()


def start_archiver(run: DemoRun) -> None:
    archiver = run.archiver
    port = int(archiver.url.rpartition(":")[2])
    assert archiver.config is not None
    archiver.config.write_text(archiver_config(run.services, run_id=run.run_id, port=port))
    topics = archiver.start()
    archive = run.archive
    run.console.print(
        f"   group {archive.consumer_group} (pinned: no purge passes its committed offset), "
        f"{len(topics)} topics, objects every {ARCHIVE_DELAY:.0f}s under "
        f"s3://{archive.bucket}/{archive.prefix}"
    )


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
    for datanode in run.workload.datanodes.values():
        # A restart whose replay start is below Kafka's log start reads the archive first.
        datanode.archive = ObjectStore(run.archive)
    run.workload.start()
    run._watcher = Watcher(
        run.workload, run.viewer, run.findings, archive_group=run.archive.consumer_group
    )
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


@dataclass(frozen=True, slots=True)
class TrimTarget:
    """Where the demo trims: `topic` to `offset`, past what `region_id` on `node_id` needs."""

    node_id: int
    region_id: int
    topic: str
    offset: int
    need: int
    cut: int
    """The region's unflushed entries below `offset`: what only the archive will hold."""


def choose_trim(
    unflushed: Iterable[tuple[int, int, str, Iterable[int]]], archived: Mapping[str, int | None]
) -> TrimTarget | None:
    """The region to trim past, from `(node_id, region_id, topic, unflushed entry ids)`: the
    one with the most unflushed entries below its topic's archived offset (the archive's
    committed offset: every entry below it is archived and verified), trimmed to that
    offset. None when no region needs an archived entry."""
    best: TrimTarget | None = None
    for node_id, region_id, topic, ids in unflushed:
        offset = archived.get(topic)
        cut = sorted(e for e in ids if offset is not None and e < offset)
        if offset is None or not cut:
            continue
        if best is None or len(cut) > best.cut:
            best = TrimTarget(node_id, region_id, topic, offset, cut[0], len(cut))
    return best


def _archived_ranges(store: ObjectStore, topic: str) -> list[ArchivedRange]:
    """The topic's archived objects: one listing of its prefix."""
    ranges = []
    for obj in store.list(topic_prefix(store.prefix, topic)):
        try:
            ranges.append(parse_object_key(store.prefix, obj.key))
        except InvalidArgument:
            continue  # not an archived object
    return ranges


def _trim_target(run: DemoRun, timeout: float = 30.0) -> TrimTarget:
    """A region that needs entries the archive holds (slow ones, which flush only when asked,
    first), once the archive's committed offset passed one."""
    slow = {p.region_id for p in run.workload.plans if p.kind is RegionKind.SLOW}
    deadline = time.monotonic() + timeout
    while True:
        run.watcher.tick()
        archived = {p.topic: run.watcher.archived(p) for p in run.watcher.plans.values()}
        regions = [
            (node_id, region.region_id, region.topic, region.unflushed_entry_ids())
            for node_id, datanode in run.workload.datanodes.items()
            for region in list(datanode.regions.values())
        ]
        target = choose_trim([r for r in regions if r[1] in slow], archived) or choose_trim(
            regions, archived
        )
        if target is not None:
            return target
        if time.monotonic() > deadline:
            raise MetasrvError(f"no region needed an archived entry within {timeout:.0f}s")
        time.sleep(1.0)


def _delete_records(bootstrap: str, topic: str, offset: int) -> int:
    """DeleteRecords(topic, partition 0, offset) through confluent-kafka's own AdminClient, as
    an operator's tool would (not metasrv's); returns the new log start."""
    # Warnings and worse only: its background queue's notices would land in the live table.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    futures = admin.delete_records([TopicPartition(topic, 0, offset)], operation_timeout=10)
    [(_, future)] = futures.items()
    return int(future.result(timeout=30).low_watermark)


def trim_and_restore(run: DemoRun) -> None:
    target = _trim_target(run)
    workload = run.workload
    workload.kill(target.node_id)
    log_start = run.watcher.admin.offsets([target.topic])[target.topic].log_start_offset
    coverage = covering(_archived_ranges(run.store, target.topic), log_start, target.offset)
    if not coverage.covered:
        raise MetasrvError(
            f"the archive does not hold [{log_start}, {target.offset}) of {target.topic}: "
            f"gap {coverage.gap}"
        )
    run.findings.trims.append(Trim(target.topic, target.offset, log_start, target.need))
    new_start = _delete_records(run.services.kafka_bootstrap, target.topic, target.offset)
    run.console.print(
        f"   datanode {target.node_id} killed; region {target.region_id} needs {target.topic} "
        f"from {target.need}; the archive holds [{log_start}, {target.offset}) in "
        f"{len(coverage.objects)} objects"
    )
    run.console.print(
        f"   DeleteRecords({target.topic}, {target.offset}) out of band: log start "
        f"{log_start} -> {new_start}, {target.cut} of the region's unflushed entries gone "
        "from Kafka"
    )
    recovery = workload.restart(target.node_id)
    run.findings.recoveries.append(recovery)
    run.console.print(recovery_table([recovery]))
    # The rows back in memory below the new log start: only the archive held them.
    restored = sum(
        sum(1 for e in r.unflushed_entry_ids() if e < new_start)
        for r in list(workload.datanodes[target.node_id].regions.values())
        if r.topic == target.topic
    )
    run.findings.restored_rows += restored
    if restored == 0:
        raise MetasrvError(
            f"datanode {target.node_id} restored no row of {target.topic} below {new_start} "
            "from the archive"
        )
    run.console.print(
        f"   its regions read {from_archive(recovery)} WAL records from the archive "
        f"(replay-start's `archive` objects), then Kafka from {new_start}: {restored} "
        f"acknowledged rows that only the archive held are back, {recovery.missing} missing"
    )
    # What the trim cut is held in memory again; flushed, it no longer needs the archive,
    # and the topic's purges (failing on the loss meanwhile) resume.
    flushed = 0
    for datanode in workload.datanodes.values():
        for r in list(datanode.regions.values()):
            if r.topic == target.topic and any(e < new_start for e in r.unflushed_entry_ids()):
                r.flush()
                flushed += 1
    run.console.print(f"   flushed the {flushed} regions of {target.topic} that needed the trim")


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
    Phase(lambda r: "Local services (Kafka, etcd, PostgreSQL, S3)", start_services),
    Phase(lambda r: "History database migrations (metasrv db upgrade)", migrate_history),
    Phase(lambda r: f"Start metasrv (etcd kv, PostgreSQL history) on {r.url}", start_metasrv),
    Phase(lambda r: "Start one WAL archiver (metasrv archive -c FILE)", start_archiver),
    Phase(lambda r: "Register regions and start the simulated datanodes", start_datanodes),
    Phase(
        lambda r: (
            f"Writing; the ticker purges every {PRUNE_INTERVAL:.0f}s, the archiver copies "
            "the WAL to S3"
        ),
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
        lambda r: (
            "Trim a topic past a region's need (out-of-band DeleteRecords); its datanode "
            "restarts from the WAL archive"
        ),
        trim_and_restore,
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
    return (*PHASES[:6], _BROKER_PHASE, *PHASES[6:])
