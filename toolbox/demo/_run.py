"""`metasrv demo`: the main job end to end on the local real services, with simulated datanodes.

The demo is the list `PHASES`, numbered by its order: bring the stack up (Kafka, etcd,
PostgreSQL), migrate the history database, start a `metasrv start` child on etcd + PostgreSQL
with short intervals and the WAL archive enabled, start one archiver (`metasrv archive`) copying
the WAL to the stack's S3 server, run simulated datanodes writing real WAL records while the
ticker purges and manual purges are submitted, kill one datanode (its topics must stop being
purged), restart it (every acknowledged row must come back), trim a topic past what a region
still needs with an out-of-band DeleteRecords and restart that region's datanode through the
archive (replay-start names the objects; every acknowledged row must come back), then
crash-restart every datanode for a final check. Exit status 1 when any acknowledged row is
missing, an entry a region needed is neither in Kafka nor in the archive, or the metasrv died.
Child processes are stopped and the run's topics and objects removed at the end; the stack
keeps running.

With `cluster` (`metasrv demo --cluster`) it runs on the production-shaped cluster instead
(`toolbox.stack.cluster_up`: three Kafka brokers, topics at replication factor 3 with
`min.insync.replicas` 2, a 3-member etcd), and one more phase SIGKILLs the broker that
leads a WAL topic's partition while datanodes write and purges run, then restarts it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time

from rich.console import Console
from rich.panel import Panel

from metasrv import wire
from metasrv.errors import MetasrvError, WalDataLoss
from toolbox.demo._config import NUM_TOPICS, DemoOptions
from toolbox.demo._context import DemoRun
from toolbox.demo._phases import Phase, phases
from toolbox.demo._report import archive_text, failure_text, summary_table


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
    run.console.print(f"WAL archive: {archive_text(run.findings)}")
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
            "[bold green]demo passed[/bold green]: every acknowledged row recovered "
            f"({run.findings.restored_rows} of them only the WAL archive held after the "
            "trim), no needed WAL entry lost"
        )
        if options.run_dir is None:
            shutil.rmtree(run.run_dir, ignore_errors=True)
        return 0
    console.print()
    console.print(f"[bold red]demo FAILED[/bold red]: {failure_text(run.findings)}")
    console.print(f"logs: {run.run_dir}")
    return 1
