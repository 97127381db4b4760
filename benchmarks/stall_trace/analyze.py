"""Summarise a stall trace written by `benchmarks/stall_trace/sitecustomize.py`.

    python benchmarks/stall_trace/analyze.py /tmp/trace.<pid>.json [N]

Prints the stall count and total, GC passes over 10 ms by generation, the N longest stalls
with their most sampled stacks, busy samples by first application frame, and the longest
sampler gaps (the GIL held by C code, or the process descheduled).
"""

import collections
import json
import sys

with open(sys.argv[1]) as fh:
    d = json.load(fh)
st = d["stalls"]
gaps = d["gaps"]
gcs = d["gc"]
print("stalls>40ms:", len(st), "total ms", round(sum(s["ms"] for s in st)))
print(
    "gaps>30ms:",
    len(gaps),
    "gc>10ms:",
    len(gcs),
    "gc ms total",
    round(sum(g["ms"] for g in gcs)),
    "max gc",
    max([g["ms"] for g in gcs] or [0]),
)
print("gc gens:", collections.Counter(g["gen"] for g in gcs))
t0 = min([s["at"] for s in st] + [g["at"] for g in gaps] or [0])
for s in sorted(st, key=lambda s: -s["ms"])[: int(sys.argv[2]) if len(sys.argv) > 2 else 12]:
    print(f"\n{s['ms']} ms at +{s['at'] - t0:.0f}s")
    for stack, n in s["top"][:3]:
        print("  ", n, stack[:400])
agg = collections.Counter()
for s in st:
    for stack, n in s["top"]:
        frames = stack.split(" <- ")
        key = next(
            (f for f in frames if "metasrv/" in f or "procedures/" in f or "api/" in f), frames[0]
        )
        agg[key] += n
print("\nby first app frame (samples of 2ms):")
for k, n in agg.most_common(25):
    print(f"{n:6d} {k}")
print("\nlongest gaps:")
for g in sorted(gaps, key=lambda g: -g["ms"])[:8]:
    print(g["ms"], g["stack"][:4])
