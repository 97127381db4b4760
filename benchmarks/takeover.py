"""Leader takeover at a million routes: SIGKILL the leader, time the survivor's first 200.

Writes N routes in DESIGN §4's layout under a fresh key prefix (etcd, or a fresh
PostgreSQL schema), starts two `metasrv start` processes on it, waits until the first
leads and serves and the follower has answered for `--settle` seconds (a warm follower has
loaded and follows the map by then), then SIGKILLs the leader. A probe posts an empty
heartbeat to both processes every 20 ms from the kill on: the figure is the time from the
SIGKILL to the survivor's first 200 (a follower answers 421, a leader loading its map 503).
Also reported: the time from the first leader's `/healthz` to its first 200 (a fresh
leader's load), and both processes' RSS before the kill (the follower's includes its
warm map).

`--kill-when-ready` SIGKILLs the leader the moment the follower's `GET /readyz` first
answers 200 instead of after `--settle` seconds: what an orchestrator does that waits for
the new process's readiness before it stops the old one (a Kubernetes rolling update). A
follower is ready once its map is loaded and followed, so the take-over is the warm one;
also reported: the follower's start -> ready time and the `follower_map` checks it
answered meanwhile (the last one and how many 503s).

`--code DIR` runs the daemons from another checkout of this repository (a
`git worktree` of an older commit) with this virtualenv: the baseline in the same run.
Without it they run the code this script imports (`PYTHONPATH` first), which is how
`benchmarks/compare.py` runs the figure at an older commit.

    python benchmarks/takeover.py [--kv etcd|postgresql] [--routes 1000000] [--lease 5]
        [--settle 60 | --kill-when-ready] [--code DIR] [--json]

Uses the stack (`metasrv stack up`): its etcd, PostgreSQL and Kafka.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from _proc import rss_mib
from _results import commit_of, product_tree

from metasrv import keys
from metasrv.kv import EtcdKv, KvBackend, SqlKv
from toolbox.simulator import MetasrvProcess, free_port, render_config
from toolbox.stack import StackConfig, endpoints_of

ROOT = Path(__file__).resolve().parent.parent
PROBE_EVERY = 0.02
HEARTBEAT = {"node_id": 1, "addr": "probe:4001", "regions": [], "topics": []}


def upgrade(code: Path, url: str) -> None:
    """Migrate `url` with the migrations of the code under test (a baseline has its own)."""
    subprocess.run(
        [sys.executable, "-c", f"import migrations; migrations.upgrade({url!r})"],
        cwd=code,
        env=dict(os.environ, PYTHONPATH=str(code)),
        check=True,
    )


def write_routes(kv: KvBackend, prefix: str, routes: int, topics: int) -> float:
    started = time.monotonic()
    chunk = 50_000
    for first in range(0, routes, chunk):
        kv.batch_put(
            [
                (keys.topic_region(f"{prefix}_wal_{r % topics}", r), keys.encode_route(1, r))
                for r in range(first, min(routes, first + chunk))
            ]
        )
    return time.monotonic() - started


@contextlib.contextmanager
def kv_store(kind: str, prefix: str, code: Path) -> Iterator[tuple[KvBackend, dict[str, Any]]]:
    endpoints = endpoints_of(StackConfig.from_env())
    if kind == "etcd":
        etcd = EtcdKv([endpoints.etcd_endpoint], f"{prefix}/", timeout=60)
        try:
            yield (
                etcd,
                {
                    "backend": "etcd",
                    "etcd_endpoints": [endpoints.etcd_endpoint],
                    "key_prefix": f"{prefix}/",
                },
            )
        finally:
            with contextlib.suppress(Exception):
                etcd.delete_prefix("")
            etcd.close()
        return
    from sqlalchemy import create_engine, text

    base = endpoints.postgres_url
    engine = create_engine(base)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {prefix}"))
    url = f"{base}?options=-csearch_path%3D{prefix}"
    upgrade(code, url)
    sql = SqlKv(url, "")
    try:
        yield sql, {"backend": "sql", "sql_url": url}
    finally:
        sql.close()
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {prefix} CASCADE"))
        engine.dispose()


def start_daemon(
    code: Path,
    workdir: Path,
    name: str,
    kv: dict[str, Any],
    prefix: str,
    lease: int,
    *,
    prune_interval: str = "0s",
) -> MetasrvProcess:
    """`metasrv start` from `code` (its log: `workdir/<name>.log`), spawned."""
    port = free_port()
    endpoints = endpoints_of(StackConfig.from_env())
    config = workdir / f"{name}.toml"
    config.write_text(
        render_config(
            {
                "wal": {
                    "broker_endpoints": [endpoints.kafka_bootstrap],
                    "num_topics": 64,
                    "topic_name_prefix": f"{prefix}_wal",
                    "auto_prune_interval": prune_interval,
                },
                "http": {"addr": f"127.0.0.1:{port}"},
                "kv": kv,
                "history": {"url": f"sqlite:///{workdir / (name + '-history.db')}"},
                "election": {"node_name": name, "lease_secs": lease},
            }
        )
    )
    upgrade(code, f"sqlite:///{workdir / (name + '-history.db')}")
    daemon = MetasrvProcess(
        config,
        workdir / f"{name}.log",
        f"http://127.0.0.1:{port}",
        env={"PYTHONPATH": str(code)},
        cwd=code,
        new_session=False,
    )
    daemon.spawn()
    return daemon


def status(client: httpx.Client, url: str) -> int:
    try:
        return client.post(f"{url}/v1/heartbeat", json=HEARTBEAT, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def wait_ready(
    client: httpx.Client, url: str, proc: MetasrvProcess, started: float
) -> dict[str, Any]:
    """Probe `url`'s `/readyz` every `PROBE_EVERY` until it answers 200; what it said
    (`started`: when the process was started)."""
    not_ready = 0
    last_check: str | None = None
    while time.monotonic() - started < 600:
        if not proc.alive():
            raise SystemExit("second daemon exited before it was ready")
        try:
            resp = client.get(f"{url}/readyz", timeout=2)
        except httpx.HTTPError:
            resp = None
        if resp is not None and resp.status_code == 200:
            return {
                "follower_start_to_ready_s": round(time.monotonic() - started, 2),
                "follower_not_ready_answers": not_ready,
                "follower_last_loading_check": last_check,
            }
        if resp is not None:
            not_ready += 1
            with contextlib.suppress(ValueError, KeyError, TypeError):
                last_check = resp.json()["error"]["checks"].get("follower_map", last_check)
        time.sleep(PROBE_EVERY)
    raise SystemExit("second daemon was not ready within 600 s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"tk{uuid.uuid4().hex[:6]}"
    code = Path(args.code).resolve() if args.code else product_tree()
    commit = commit_of(code)
    result: dict[str, Any] = {"kv": args.kv, "routes": args.routes, "lease_s": args.lease}
    result["kill"] = "when ready" if args.kill_when_ready else f"after {args.settle:g} s"
    result["code"] = commit
    workdir = Path(tempfile.mkdtemp(prefix="metasrv-takeover-"))
    procs: list[MetasrvProcess] = []
    with kv_store(args.kv, prefix, code) as (kv, kv_section), httpx.Client() as client:
        result["write_routes_s"] = round(write_routes(kv, prefix, args.routes, 64), 1)
        try:
            a = start_daemon(code, workdir, "a", kv_section, prefix, args.lease)
            a_url = a.url
            procs.append(a)
            healthy_at = None
            while True:
                if not a.alive():
                    raise SystemExit(f"first daemon exited; see {workdir}/a.log")
                if healthy_at is None:
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"{a_url}/healthz", timeout=2).status_code == 200:
                            healthy_at = time.monotonic()
                elif status(client, a_url) == 200:
                    result["fresh_leader_serves_s"] = round(time.monotonic() - healthy_at, 2)
                    break
                time.sleep(PROBE_EVERY)
            b_started = time.monotonic()
            b = start_daemon(code, workdir, "b", kv_section, prefix, args.lease)
            b_url = b.url
            procs.append(b)
            up_by = time.monotonic() + 300
            while status(client, b_url) != 421:
                if not b.alive() or time.monotonic() > up_by:
                    raise SystemExit(f"second daemon is not a follower; see {workdir}/b.log")
                time.sleep(0.2)
            if args.kill_when_ready:
                result.update(wait_ready(client, b_url, b, b_started))
            else:
                time.sleep(args.settle)
            result["leader_rss_mib"] = round(rss_mib(a.pid), 1)
            result["follower_rss_mib"] = round(rss_mib(b.pid), 1)
            os.kill(a.pid, signal.SIGKILL)
            killed = time.monotonic()
            a.stop()
            seen: dict[int, float] = {}
            while time.monotonic() - killed < 120:
                code_ = status(client, b_url)
                seen.setdefault(code_, round(time.monotonic() - killed, 2))
                if code_ == 200:
                    break
                time.sleep(PROBE_EVERY)
            result["survivor_serves_after_kill_s"] = seen.get(200)
            result["survivor_first_seen_s"] = {str(k): v for k, v in sorted(seen.items())}
        finally:
            for proc in procs:
                proc.stop(30)
    result["logs"] = str(workdir)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--kv", choices=("etcd", "postgresql"), default="etcd")
    parser.add_argument("--routes", type=int, default=1_000_000)
    parser.add_argument("--lease", type=int, default=5, help="election lease seconds")
    parser.add_argument("--settle", type=float, default=60.0, help="follower up before the kill")
    parser.add_argument(
        "--kill-when-ready",
        action="store_true",
        help="SIGKILL the leader when the follower's /readyz first answers 200 (no --settle)",
    )
    parser.add_argument("--code", default=None, help="checkout to run the daemons from")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:30} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
