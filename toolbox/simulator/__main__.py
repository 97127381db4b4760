"""Run a simulated datanode as its own OS process: `python -m toolbox.simulator run|recover`.

Fault tests SIGKILL the `run` process and start a new one (`recover`, or `run` again) on
the same data dir: regions found there are replayed and verified before anything else.
Events are JSON lines on stdout (`ready`, `recovered`, `stats`, `stopped`, `error`); logs go
to stderr. Exit codes: 0 ok, 2 WAL data loss (replay start no longer in Kafka),
3 acknowledged rows missing after recovery, 1 any other error.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

from metasrv.errors import MetasrvError, WalDataLoss
from metasrv.settings import load_settings
from toolbox.simulator._datanode import SimDatanode
from toolbox.simulator._region import SimRegion
from toolbox.simulator._workload import drive_writes

EXIT_DATA_LOSS = 2
EXIT_MISSING = 3


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _parse_region(text: str) -> tuple[int, str, bool]:
    """`ID:TOPIC` or `ID:TOPIC:slow`."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "slow"):
        raise argparse.ArgumentTypeError(f"expected ID:TOPIC[:slow], got {text!r}")
    return int(parts[0]), parts[1], len(parts) == 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m toolbox.simulator")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("run", "recover regions on disk, open new ones, write and heartbeat until signalled"),
        ("recover", "recover regions on disk, verify every acknowledged row, exit"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--node-id", type=int, required=True)
        p.add_argument("--kafka", required=True, help="bootstrap host:port")
        p.add_argument("--data-dir", required=True)
        p.add_argument("--metasrv", default=None, help="metasrv URL (heartbeats, replay-start)")
        p.add_argument("--token", default=None, help="datanode token")
        p.add_argument(
            "--archive-config",
            default=None,
            help="a metasrv TOML file whose [wal.archive] names the WAL archive replays read",
        )
        p.add_argument(
            "--replay-from-flushed",
            action="store_true",
            help="without a metasrv: replay from each region's flushed entry id + 1",
        )
        p.add_argument("--heartbeat-interval", type=float, default=1.0)
        p.add_argument("--flush-threshold", type=int, default=64 * 1024, help="bytes")
        if name == "run":
            p.add_argument("--region", type=_parse_region, action="append", default=[])
            p.add_argument("--write-rate", type=float, default=50.0, help="rows per second")
            p.add_argument("--row-bytes", type=int, default=200)
            p.add_argument("--seed", type=int, default=7)
            p.add_argument(
                "--duration", type=float, default=0.0, help="seconds; 0: until signalled"
            )
    return parser


def _recover(datanode: SimDatanode, args: argparse.Namespace, *, start: bool) -> bool:
    """Replay and verify the regions on disk; emit `recovered`. False if any row is missing."""
    if not datanode.region_dirs():
        return True
    replay_start = None
    if args.replay_from_flushed:

        def replay_start(region_id: int) -> int:
            manifest = SimRegion.stored_manifest(datanode.data_dir / f"region_{region_id}")
            assert manifest is not None
            return manifest.flushed_entry_id + 1

    recoveries = datanode.restart(replay_start, start=start)
    verifications = datanode.verify()
    _emit(
        "recovered",
        node_id=datanode.node_id,
        recoveries=[asdict(r) for r in recoveries],
        verifications=[asdict(v) for v in verifications],
        acknowledged=sum(v.acknowledged for v in verifications),
        recovered_from_sst=sum(v.recovered_from_sst for v in verifications),
        replayed=sum(r.replayed for r in recoveries),
        missing=sum(v.missing for v in verifications),
    )
    return all(v.ok for v in verifications)


def _run(datanode: SimDatanode, args: argparse.Namespace) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if not _recover(datanode, args, start=False):
        return EXIT_MISSING
    for region_id, topic, slow in args.region:
        if region_id not in datanode.regions:
            datanode.add_region(
                region_id, topic, flush_threshold_bytes=None if slow else args.flush_threshold
            )
    datanode.start()
    _emit("ready", node_id=datanode.node_id, regions=sorted(datanode.regions))
    writer = threading.Thread(
        target=drive_writes,
        args=(datanode, dict.fromkeys(datanode.regions, 1.0)),
        kwargs={
            "rate": args.write_rate,
            "row_bytes": args.row_bytes,
            "rng": random.Random(args.seed * 1_000_003 + args.node_id),
            "stop": stop,
        },
        daemon=True,
    )
    if args.write_rate > 0 and datanode.regions:
        writer.start()
    deadline = time.monotonic() + args.duration if args.duration > 0 else None
    while not stop.wait(1.0):
        datanode.check()
        _emit(
            "stats",
            acknowledged=sum(r.acknowledged for r in datanode.regions.values()),
            flushed={str(r.region_id): r.flushed_entry_id for r in datanode.regions.values()},
            heartbeats=datanode.heartbeats_sent,
        )
        if deadline is not None and time.monotonic() >= deadline:
            stop.set()
    if writer.is_alive():
        writer.join()
    datanode.stop()
    _emit("stopped", node_id=datanode.node_id)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    archive = None
    if args.archive_config is not None:
        try:
            archive = load_settings(args.archive_config).wal.archive
        except MetasrvError as exc:
            _emit("error", code=exc.code, message=exc.message, details=exc.details)
            return 1
    datanode = SimDatanode(
        args.node_id,
        args.metasrv,
        args.token,
        args.kafka,
        args.data_dir,
        heartbeat_interval=args.heartbeat_interval,
        flush_threshold_bytes=args.flush_threshold,
        archive=archive,
    )
    try:
        if args.command == "recover":
            ok = _recover(datanode, args, start=False)
            return 0 if ok else EXIT_MISSING
        return _run(datanode, args)
    except WalDataLoss as exc:
        _emit("error", code=exc.code, message=exc.message, details=exc.details)
        return EXIT_DATA_LOSS
    except MetasrvError as exc:
        _emit("error", code=exc.code, message=exc.message, details=exc.details)
        return 1
    finally:
        datanode.close()


if __name__ == "__main__":
    sys.exit(main())
