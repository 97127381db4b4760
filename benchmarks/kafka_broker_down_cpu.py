"""CPU of metasrv's Kafka admin client with every broker up, then with one of three down.

A child process holds one `KafkaAdmin` on the 3-broker cluster and reads the offsets of
`--topics` WAL-like topics (replication factor 3) every `--interval` seconds, as the
leader's purges, plans and readiness probes do. The parent samples the child's CPU from
/proc/<pid>/stat every `--sample` seconds: `--samples` samples with every broker up, then
it SIGKILLs the broker leading the most of those topics, lets Kafka fence it and elect new
leaders (`--settle` seconds, reported on its own as the transition), and takes `--samples`
samples more. Figures: the median CPU (cores) of each phase and the difference. Target
(issue 23): <= 0.05 core above idle with one broker down.

    .venv/bin/python benchmarks/kafka_broker_down_cpu.py [--topics 6] [--samples 6]
        [--sample 5] [--interval 3] [--settle 20] [--checkout DIR]

`--checkout DIR` measures the client of another source tree; `benchmarks/compare.py
--base COMMIT -- benchmarks/kafka_broker_down_cpu.py` measures an older commit's side by
side with this one.

The cluster comes from `toolbox.stack.cluster_up()` (started if needed) and is healed at
the end, whatever happens; the topics get a unique prefix and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING

# The measured client imports metasrv from --checkout (another commit's tree) when given,
# else from where the interpreter finds it (`PYTHONPATH` first: compare.py's older commit).
CHECKOUT = os.environ.get("METASRV_CHECKOUT")
if CHECKOUT:
    sys.path.insert(0, CHECKOUT)

from _proc import cpu_seconds  # noqa: E402

from metasrv.errors import MetasrvError  # noqa: E402
from metasrv.kafka import KafkaAdmin  # noqa: E402

if TYPE_CHECKING:
    from toolbox.stack import Cluster


def client_loop(bootstrap: str, topics: list[str], interval: float) -> None:
    """The measured process: read offsets forever, errors included (they are the point)."""
    admin = KafkaAdmin(bootstrap)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        with contextlib.suppress(MetasrvError):
            admin.offsets(topics)
        time.sleep(interval)


def sample(pid: int, count: int, seconds: float) -> list[float]:
    """`count` CPU readings of `pid`, in cores, each over `seconds`."""
    out: list[float] = []
    for _ in range(count):
        t0, c0 = time.monotonic(), cpu_seconds(pid)
        time.sleep(seconds)
        out.append((cpu_seconds(pid) - c0) / (time.monotonic() - t0))
    return out


def busiest_leader(cluster: Cluster, topics: list[str]) -> int:
    """Node id of the broker leading the most of `topics` (partition 0)."""
    leaders = Counter(cluster.partition_leader(t) for t in topics)
    return leaders.most_common(1)[0][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=6)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--sample", type=float, default=5.0, help="seconds per sample")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between reads")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after the kill")
    parser.add_argument(
        "--checkout", help="measure the KafkaAdmin of this source tree (e.g. a git worktree)"
    )
    parser.add_argument("--client", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_loop(args.client[0], args.client[1:], args.interval)
        return

    from toolbox.stack import cluster_up  # the parent only: an old checkout may lack it

    cluster = cluster_up()
    prefix = f"cpubench_{uuid.uuid4().hex[:8]}"
    topics = [f"{prefix}_{n}" for n in range(args.topics)]
    admin = KafkaAdmin(cluster.kafka_bootstrap)
    admin.ensure_topics(topics, replication_factor=3)
    child: subprocess.Popen[str] | None = None
    try:
        command = [sys.executable, __file__, "--interval", str(args.interval)]
        child = subprocess.Popen(
            [*command, "--client", cluster.kafka_bootstrap, *topics],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "METASRV_CHECKOUT": args.checkout or ""},
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(args.interval)  # connections made, first reads done
        up = sample(child.pid, args.samples, args.sample)
        victim = cluster.broker_of(busiest_leader(cluster, topics))
        cluster.kill(victim)
        transition = sample(child.pid, 1, args.settle)[0]
        down = sample(child.pid, args.samples, args.sample)
    finally:
        if child is not None:
            child.kill()
            child.wait()
        cluster.heal()
        with contextlib.suppress(MetasrvError):
            admin.delete_topics(topics)
    idle, broken = statistics.median(up), statistics.median(down)
    print(f"topics {args.topics} (RF 3), reads every {args.interval:g} s, killed {victim}")
    print(f"all brokers up:  median {idle:.4f} core over {args.samples} x {args.sample:g} s")
    print(f"first {args.settle:g} s after the kill: {transition:.4f} core")
    print(f"one broker down: median {broken:.4f} core over {args.samples} x {args.sample:g} s")
    print(f"above idle:      {broken - idle:+.4f} core (target <= 0.05)")


if __name__ == "__main__":
    main()
