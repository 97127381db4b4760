"""Takeover under load: SIGKILL the leader while datanodes heartbeat, and time what they see.

Writes the topic-region map of `--nodes` x `--regions` synthetic regions (load.py's layout:
64 topics, routes in DESIGN §4's layout) under a fresh etcd prefix or a fresh PostgreSQL
schema (`--kv`), starts a leader and then a follower with `metasrv start` (takeover.py's
daemons, a `--lease` s lease, purge rounds every `--prune-interval`), waits until the
follower has loaded its warm map, then runs load.py's raw generators: every datanode
heartbeats every `--interval` s, knows both addresses and follows the leader as the
product's datanode client does (`_failover.py`). `--steady` s after the load starts the
leader is SIGKILLed; the load goes on `--after` s more.

Reported, from the datanodes' own records of each 200 (send time, latency, datanode):

1. SIGKILL -> the first 200 any datanode got after it (from the survivor);
2. per datanode, the gap between successive 200s that spans the kill: max and median over
   the datanodes (and the longest gap at any time in the run);
3. p99 latency over the first minute after the survivor's first 200, and per 15 s window
   across it; the same over the fresh leader's first minute from the load's start;
4. when the first purge could run: the ticker's line "first purge round of the term" (every
   mapped region reported) in each leader's log, from the SIGKILL for the survivor and from
   the load's start for the fresh leader ("not observable" when the code has no such line);
5. follower RSS with its warm map just before the kill, survivor RSS after it; and from the
   logs, the survivor's election and map catch-up, and every leadership change.

`--code DIR` runs the daemons from a worktree of another commit with this virtualenv (its
own migrations too), for the baseline in the same run; the generators are this tree's.
`--cap-jitter` sets the spread of the generators' datanodes' backoff at its cap
(`metasrv.datanode.Backoff`; 1 is full jitter at the cap too).
Results: `benchmarks/results/takeover-load-<kv>-<time>.json`, and a table. Uses the stack
(`metasrv stack up`): its Kafka, etcd and PostgreSQL.

    python benchmarks/takeover_load.py [--kv etcd|postgresql] [--nodes 1000] [--regions 1000]
        [--interval 3] [--steady 120] [--after 120] [--lease 5] [--cap-jitter J]
        [--code DIR] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
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
import numpy as np
from _proc import rss_mib
from _results import commit_of, product_tree, stamp, write_result
from load import NODE_BASE, Sampler, region_id, topic_of, wait_serving
from takeover import kv_store, start_daemon, status

from metasrv import keys
from metasrv.datanode import Backoff
from metasrv.kafka import KafkaAdmin
from toolbox.simulator import MetasrvProcess, log_records
from toolbox.stack import StackConfig, endpoints_of

TOPICS = 64
"""takeover.py's daemons run 64 topics."""
MAP_LOADED = "topic-region map loaded"
"""A process's log line once it holds the map (a warm follower's, before it leads)."""
FIRST_ROUND = "first purge round of the term"
"""The start of the ticker's line (procedures/wal_purge/_ticker.py) when a term's first
purge round becomes possible."""
WINDOW = 15.0
"""Seconds per latency window across a first minute."""


def routes(prefix: str, nodes: int, regions: int) -> Iterator[tuple[str, bytes]]:
    for n in range(nodes):
        for i in range(regions):
            topic = topic_of(prefix, n, i, regions, TOPICS)
            yield keys.topic_region(topic, region_id(n, i)), keys.encode_route(NODE_BASE + n, None)


def serves(daemon: MetasrvProcess) -> float:
    """Seconds from the daemon's `/healthz` to its first served request."""
    while True:
        if not daemon.alive():
            raise SystemExit(f"the first daemon exited; see {daemon.log_path}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{daemon.url}/healthz", timeout=2).status_code == 200:
                return wait_serving(daemon.url)
        time.sleep(0.05)


def logged_after(log: Path, msg: str, since: float) -> tuple[float, dict[str, Any]] | None:
    """Seconds from `since` (wall time) to the first line of `log` starting with `msg` at
    or after it, and the line."""
    found = log_records(log, msg, since - 0.001)
    return None if not found else (found[0][0] - since, found[0][1])


def wait_logged(daemon: MetasrvProcess, msg: str, timeout: float) -> float:
    """Seconds until `msg` is in the daemon's log (SystemExit if it exits first)."""
    t0 = time.monotonic()
    while not daemon.log_records(msg):
        if not daemon.alive() or time.monotonic() - t0 > timeout:
            raise SystemExit(f"no {msg!r} in {daemon.log_path}")
        time.sleep(0.5)
    return round(time.monotonic() - t0, 1)


def leadership(workdir: Path, killed: float) -> list[str]:
    """Elections and losses in both logs, "<s from the SIGKILL> <process> <event>": a run
    whose leader lost its lease before the kill (a slow etcd) measured something else."""
    found = [
        (ts - killed, name, msg, str(rec.get("reason") or "")[:60])
        for name in ("a", "b")
        for msg in ("elected leader", "leadership lost")
        for ts, rec in log_records(workdir / f"{name}.log", msg)
    ]
    return [f"{t:+.2f} {p} {m}" + (f" ({r})" if r else "") for t, p, m, r in sorted(found)]


def generators(
    args: argparse.Namespace, urls: list[str], workdir: Path, prefix: str, start_at: float
) -> list[subprocess.Popen[bytes]]:
    """load.py's raw generator processes; each datanode knows every URL, the first first."""
    kafka = endpoints_of(StackConfig.from_env()).kafka_bootstrap
    per = -(-args.nodes // args.clients)
    procs = []
    for c, first in enumerate(range(0, args.nodes, per)):
        argv = [sys.executable, str(Path(__file__).with_name("load.py")), "--client"]
        argv += ["--generator", "raw", "--url", urls[0], "--urls", ",".join(urls[1:])]
        argv += ["--leader-addr", urls[0].removeprefix("http://"), "--prefix", prefix]
        argv += ["--node-range", f"{first}:{min(args.nodes, first + per)}", "--kafka", kafka]
        argv += ["--out-file", str(workdir / f"client-{c}.json"), "--start-at", str(start_at)]
        argv += ["--nodes", str(args.nodes), "--regions", str(args.regions)]
        argv += ["--topics", str(TOPICS), "--interval", str(args.interval)]
        argv += ["--change", str(args.change), "--duration", str(args.steady + args.after)]
        argv += ["--follower-rate", "0", "--encoding", args.encoding]
        argv += ["--cap-jitter", str(args.cap_jitter)]
        procs.append(subprocess.Popen(argv))
    return procs


def read_clients(workdir: Path, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    """Every generator's counters, and every 200's send time, latency and datanode."""
    out: dict[str, Any] = {"ok": 0, "errors": {}, "cpu_seconds": 0.0, "missed": 0, "switches": 0}
    arrays: list[list[np.ndarray]] = [[], [], []]
    for c, proc in enumerate(procs):
        if proc.returncode != 0:
            raise SystemExit(f"load generator {c} exited with {proc.returncode}")
        data = json.loads((workdir / f"client-{c}.json").read_text())
        for key in ("ok", "cpu_seconds", "missed", "switches"):
            out[key] += data["leader_switches" if key == "switches" else key]
        for key, n in data["errors"].items():
            out["errors"][key] = out["errors"].get(key, 0) + n
        raw = (workdir / f"client-{c}.lat").read_bytes()
        count = data["count"]
        arrays[0].append(np.frombuffer(raw, np.float64, count, 0))
        arrays[1].append(np.frombuffer(raw, np.float64, count, 8 * count))
        arrays[2].append(np.frombuffer(raw, np.intc, count, 16 * count))
    out["sent"], out["latency"], out["node"] = (np.concatenate(a) for a in arrays)
    return out


def latency(sent: np.ndarray, lat: np.ndarray, lo: float, hi: float) -> dict[str, Any]:
    """Percentiles (ms) of the 200s sent in [lo, hi) (seconds from the load's start)."""
    ms = np.sort(lat[(sent >= lo) & (sent < hi)]) * 1000

    def pct(q: float) -> float | None:
        return round(float(ms[round(q * (len(ms) - 1))]), 1) if len(ms) else None

    return {"from_s": round(lo, 2), "count": len(ms), "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def first_minute(sent: np.ndarray, lat: np.ndarray, t0: float, end: float) -> dict[str, Any]:
    """The minute from `t0` (cut at `end`): overall and per WINDOW; `covered_s` < 60 when it
    was cut."""
    stop = min(t0 + 60.0, end)
    edges = [t0 + k * WINDOW for k in range(int(60 / WINDOW))]
    return {
        **latency(sent, lat, t0, stop),
        "covered_s": round(stop - t0, 1),
        "windows": [
            latency(sent, lat, lo, min(lo + WINDOW, stop)) for lo in edges if lo < stop - 1
        ],
    }


def gaps(sent: np.ndarray, lat: np.ndarray, node: np.ndarray, kill: float, nodes: int) -> Any:
    """SIGKILL -> first 200 after it, and each datanode's longest time without a 200."""
    arrive = sent + lat
    order = np.lexsort((arrive, node))
    n, a = node[order], arrive[order]
    same = n[1:] == n[:-1]
    gap, start, end = np.diff(a)[same], a[:-1][same], a[1:][same]
    spans = (start < kill) & (end >= kill)
    span_gap, span_end = gap[spans], end[spans]
    longest = np.zeros(nodes)
    np.maximum.at(longest, n[1:][same], gap)
    after = arrive[sent >= kill]
    first = float(after.min() - kill) if len(after) else None

    def stats(x: np.ndarray) -> dict[str, float | None]:
        if not len(x):
            return {"max_s": None, "median_s": None}
        return {"max_s": round(float(x.max()), 2), "median_s": round(float(np.median(x)), 2)}

    return first, {
        "spanning_kill": stats(span_gap),
        "back_after_kill": stats(span_end - kill),
        "datanodes_served_again": int(spans.sum()),
        "longest_any_time": stats(longest[np.unique(n)]),
    }


def stop(procs: list[subprocess.Popen[bytes]], daemons: list[MetasrvProcess]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    for daemon in daemons:
        daemon.stop(30)


def drive(
    args: argparse.Namespace,
    code: Path,
    workdir: Path,
    kv_section: dict[str, Any],
    prefix: str,
    procs: list[subprocess.Popen[bytes]],
    daemons: list[MetasrvProcess],
) -> tuple[dict[str, Any], list[subprocess.Popen[bytes]], float, float]:
    """Leader, warm follower, load, SIGKILL, load: what was read from the daemons meanwhile,
    the generators, the load's start and the kill (wall times)."""
    out: dict[str, Any] = {}
    lease, prune = args.lease, args.prune_interval
    a = start_daemon(code, workdir, "a", kv_section, prefix, lease, prune_interval=prune)
    daemons.append(a)
    out["fresh_leader_serves_s"] = serves(a)
    b = start_daemon(code, workdir, "b", kv_section, prefix, lease, prune_interval=prune)
    daemons.append(b)
    a_url, b_url = a.url, b.url
    up_by = time.monotonic() + 300
    with httpx.Client() as client:
        while status(client, b_url) != 421:
            if not b.alive() or time.monotonic() > up_by:
                raise SystemExit(f"the second daemon does not follow; see {workdir}")
            time.sleep(0.2)
    if (code / "metasrv" / "leader" / "_follower.py").exists():  # a warm follower
        out["follower_map_loaded_s"] = wait_logged(b, MAP_LOADED, 900)
    start_at = time.time() + 5.0  # each generator builds its bodies first
    clients = generators(args, [a_url, b_url], workdir, prefix, start_at)
    procs[:0] = clients
    sampler = Sampler({"leader": a.pid, "follower": b.pid})
    time.sleep(max(0.0, start_at - time.time()))
    sampler.start()
    time.sleep(max(0.0, start_at + args.steady - time.time()))
    out["leader_rss_before_kill_mib"] = round(rss_mib(a.pid), 1)
    out["follower_rss_before_kill_mib"] = round(rss_mib(b.pid), 1)
    killed = time.time()
    os.kill(a.pid, signal.SIGKILL)
    a.stop()
    for proc in clients:
        proc.wait(timeout=args.steady + args.after + 300)
    sampler.stop()
    out["survivor_rss_end_mib"] = round(rss_mib(b.pid), 1)
    after = [s.get("follower_rss_mb", 0.0) for s in sampler.samples if s["t"] > args.steady]
    out["survivor_rss_max_after_kill_mib"] = max(after, default=None)
    out["samples"] = sampler.samples
    return out, clients, start_at, killed


def run(args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"tl{uuid.uuid4().hex[:6]}"
    code = Path(args.code).resolve() if args.code else product_tree()
    commit = commit_of(code)
    ticker = code / "procedures" / "wal_purge" / "_ticker.py"
    observable = ticker.exists() and FIRST_ROUND in ticker.read_text()
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "code": commit,
        "kv": args.kv,
        "config": {k: v for k, v in vars(args).items() if k not in ("code", "out", "keep")},
    }
    result["config"]["regions_total"] = args.nodes * args.regions
    workdir = Path(tempfile.mkdtemp(prefix="metasrv-takeover-load-"))
    admin = KafkaAdmin(endpoints_of(StackConfig.from_env()).kafka_bootstrap)
    procs: list[subprocess.Popen[bytes]] = []
    daemons: list[MetasrvProcess] = []
    try:
        admin.ensure_topics([f"{prefix}_wal_{n}" for n in range(TOPICS)])
        with kv_store(args.kv, prefix, code) as (kv, kv_section):
            t0 = time.monotonic()
            pairs = routes(prefix, args.nodes, args.regions)
            while batch := list(itertools.islice(pairs, 50_000)):
                kv.batch_put(batch)
            result["write_routes_s"] = round(time.monotonic() - t0, 1)
            try:  # the daemons stop before their kv goes
                seen, clients, start_at, killed = drive(
                    args, code, workdir, kv_section, prefix, procs, daemons
                )
                result.update(seen)
            finally:
                stop(procs, daemons)
    finally:
        with contextlib.suppress(Exception):
            admin.delete_topics(t for t in admin.list_topics() if t.startswith(f"{prefix}_"))
        admin.close()
    result.update(report(args, workdir, clients, start_at, killed, observable))
    if args.keep:
        result["workdir"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def report(
    args: argparse.Namespace,
    workdir: Path,
    clients: list[subprocess.Popen[bytes]],
    start_at: float,
    killed: float,
    observable: bool,
) -> dict[str, Any]:
    """The figures, from the generators' records and the daemons' logs."""
    seen, kill = read_clients(workdir, clients), killed - start_at
    sent, lat, node = seen["sent"], seen["latency"], seen["node"]
    end = args.steady + args.after
    first, gap = gaps(sent, lat, node, kill, args.nodes)
    out: dict[str, Any] = {
        "kill_at_s": round(kill, 2),
        "survivor_first_200_after_kill_s": None if first is None else round(first, 2),
        "datanode_gap": gap,
        "fresh_leader_first_minute": first_minute(sent, lat, 0.0, kill),
        "steady_before_kill": latency(sent, lat, min(60.0, kill / 2), kill),
        "heartbeats_ok": seen["ok"],
        "heartbeats_failed": seen["errors"],
        "generator_address_switches": seen["switches"],
        "generator_missed_sends": seen["missed"],
        "generator_cpu_cores": round(seen["cpu_seconds"] / end, 3),
        "loadavg_1m_end": os.getloadavg()[0],
    }
    out["after_takeover_first_minute"] = first and first_minute(sent, lat, kill + first, end)
    out["leadership_events"] = events = leadership(workdir, killed)
    out["leader_changed_before_kill"] = any(e.startswith("-") for e in events[1:])
    b_log, a_log = workdir / "b.log", workdir / "a.log"
    for key, msg in (("elected", "elected leader"), ("map_current", "topic-region map current")):
        found = logged_after(b_log, msg, killed)
        out[f"survivor_{key}_after_kill_s"] = None if found is None else round(found[0], 2)
    for key, log, since in (("survivor", b_log, killed), ("fresh_leader", a_log, start_at)):
        found = logged_after(log, FIRST_ROUND, since) if observable else None
        if not observable:
            value: Any = "not observable (no such log line in the code under test)"
        elif found is None:
            value = "not reached in the run"
        else:
            value = {"s": round(found[0], 2), "after_term_began_s": found[1].get("after_s")}
        out[f"{key}_first_purge_possible"] = value
    return out


def print_table(result: dict[str, Any]) -> None:
    r, gap, cfg = result, result["datanode_gap"], result["config"]

    def f(value: Any) -> str:
        return "-" if value is None else str(value)

    def minute(m: dict[str, Any] | None) -> str:
        if m is None:
            return "-"
        windows = ", ".join(f(w["p99_ms"]) for w in m["windows"])
        return f"p99 {f(m['p99_ms'])} ms over {m['covered_s']} s; per {WINDOW:g} s: {windows}"

    def pair(d: dict[str, Any]) -> str:
        return f"{f(d['max_s'])} / {f(d['median_s'])} s"

    rows = [
        ("code / kv", f"{r['code']} / {r['kv']}"),
        ("load", f"{cfg['nodes']} x {cfg['regions']} regions every {cfg['interval']:g} s"),
        ("fresh leader serves after /healthz", f"{f(r['fresh_leader_serves_s'])} s"),
        ("follower holds the map after it follows", f"{f(r.get('follower_map_loaded_s'))} s"),
        ("kill at (from the load's start)", f"{r['kill_at_s']} s"),
        ("SIGKILL -> survivor's first 200", f"{f(r['survivor_first_200_after_kill_s'])} s"),
        ("survivor elected after the kill", f"{f(r['survivor_elected_after_kill_s'])} s"),
        ("survivor's map current after the kill", f"{f(r['survivor_map_current_after_kill_s'])} s"),
        ("gap spanning the kill, max / median", pair(gap["spanning_kill"])),
        ("SIGKILL -> a datanode's 200, max / median", pair(gap["back_after_kill"])),
        ("longest gap at any time, max / median", pair(gap["longest_any_time"])),
        ("first minute after takeover", minute(r["after_takeover_first_minute"])),
        ("fresh leader's first minute", minute(r["fresh_leader_first_minute"])),
        ("before the kill (steady)", f"p99 {f(r['steady_before_kill']['p99_ms'])} ms"),
        ("first purge possible, survivor", f(r["survivor_first_purge_possible"])),
        ("first purge possible, fresh leader", f(r["fresh_leader_first_purge_possible"])),
        ("follower RSS before the kill", f"{f(r['follower_rss_before_kill_mib'])} MiB"),
        (
            "survivor RSS end / max after the kill",
            f"{f(r['survivor_rss_end_mib'])} / {f(r['survivor_rss_max_after_kill_mib'])} MiB",
        ),
        ("leadership (s from the kill)", "; ".join(r["leadership_events"])),
        ("heartbeats ok / failed", f"{r['heartbeats_ok']} / {r['heartbeats_failed']}"),
        ("generator CPU (cores)", f(r["generator_cpu_cores"])),
        ("load average (1 min, end)", f(r["loadavg_1m_end"])),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--kv", choices=("etcd", "postgresql"), default="etcd")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--regions", type=int, default=1000, help="regions per datanode")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between heartbeats")
    parser.add_argument("--change", type=float, default=0.05, help="regions moved per heartbeat")
    parser.add_argument("--encoding", choices=("columns", "json"), default="columns")
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
    parser.add_argument("--steady", type=float, default=120.0, help="load seconds before the kill")
    parser.add_argument("--after", type=float, default=120.0, help="load seconds after the kill")
    parser.add_argument("--lease", type=int, default=5, help="election lease seconds")
    parser.add_argument("--prune-interval", default="300s", help="wal.auto_prune_interval")
    parser.add_argument(
        "--cap-jitter",
        type=float,
        default=Backoff().cap_jitter,
        help="the datanodes' Backoff cap_jitter (1: full jitter at the cap too)",
    )
    parser.add_argument("--code", default=None, help="checkout to run the daemons from")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    args = parser.parse_args()
    result = run(args)
    out = write_result(result, f"takeover-load-{args.kv}-{stamp()}.json", args.out)
    print_table(result)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
