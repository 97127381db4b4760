"""Stall tracer for `metasrv start` (a profiling aid, never loaded by the product).

    PYTHONPATH=benchmarks/stall_trace STALL_TRACE_OUT=/tmp/trace \
        .venv/bin/python benchmarks/load.py --duration 140
    python benchmarks/stall_trace/analyze.py /tmp/trace.<leader pid>.json

Python imports `sitecustomize` at start-up from PYTHONPATH; in a process whose argv holds
`start` this one starts a daemon thread that samples the main thread's stack every 2 ms.
The main thread is idle when its top frame is the event loop's wait (uvloop's `run`, or
selectors' `select`); a run of busy samples longer than 40 ms is a stall, kept with its
most sampled stacks. Sampler gaps over 30 ms (the GIL held by C code, or the process off
the CPU) and GC passes over 10 ms (with the young generation's size and, above 100k
objects, its types) are kept too. JSON goes to $STALL_TRACE_OUT.<pid>.json every 10 s and
at exit. The sampling costs the traced process a few percent of a core.
"""

import collections
import gc
import json
import os
import sys
import threading
import time

OUT = os.environ.get("STALL_TRACE_OUT")
if OUT:
    OUT = f"{OUT}.{os.getpid()}.json"
if OUT and "start" in sys.argv:
    main_id = threading.main_thread().ident
    stalls = []
    gaps = []
    gcs = []
    gc_t = {}

    def _gc_cb(phase, info):
        if phase == "start":
            gen = info["generation"]
            objs = gc.get_objects(gen)
            gc_t["n"] = len(objs)
            gc_t["types"] = None
            if len(objs) > 100_000:
                gc_t["types"] = collections.Counter(type(o).__name__ for o in objs).most_common(6)
            gc_t["largest"] = None
            if gen == 2:
                # What a full pass walks: the biggest containers it traverses.
                sized = [
                    (len(o), type(o).__name__, repr(next(iter(o), None))[:60])
                    for o in objs
                    if isinstance(o, (dict, list, set, frozenset, collections.deque))
                ]
                gc_t["largest"] = sorted(sized, reverse=True)[:8]
            del objs
            gc_t["t"] = time.perf_counter()
        else:
            d = time.perf_counter() - gc_t.get("t", time.perf_counter())
            if d > 0.01:
                gcs.append(
                    {
                        "at": time.time(),
                        "gen": info["generation"],
                        "ms": round(d * 1000, 1),
                        "collected": info["collected"],
                        "n": gc_t.get("n"),
                        "types": gc_t.get("types"),
                        "largest": gc_t.get("largest"),
                    }
                )

    gc.callbacks.append(_gc_cb)

    def _stack(frame):
        out = []
        while frame is not None and len(out) < 40:
            co = frame.f_code
            out.append(
                f"{co.co_name} ({'/'.join(co.co_filename.split('/')[-2:])}:{frame.f_lineno})"
            )
            frame = frame.f_back
        return out  # leaf first

    def _run():
        try:
            _loop()
        except BaseException as exc:
            with open(OUT + ".err", "w") as fh:
                fh.write(repr(exc))

    def _loop():
        run_start = None
        run_stacks = collections.Counter()
        last = time.perf_counter()
        last_dump = time.time()
        while True:
            time.sleep(0.002)
            now = time.perf_counter()
            if now - last > 0.03:
                f = sys._current_frames().get(main_id)
                gaps.append(
                    {
                        "at": time.time(),
                        "ms": round((now - last) * 1000, 1),
                        "stack": _stack(f)[:12] if f else [],
                    }
                )
            last = now
            f = sys._current_frames().get(main_id)
            if f is None:
                continue
            st = _stack(f)
            idle = bool(st) and (
                (st[0].startswith("select (") and "selectors" in st[0])
                or st[0].startswith("run (asyncio/runners.py")
            )
            if not idle:
                if run_start is None:
                    run_start = now
                    run_stacks = collections.Counter()
                # key: leaf 10 frames
                run_stacks[" <- ".join(st[:10])] += 1
            elif run_start is not None:
                dur = now - run_start
                if dur > 0.04:
                    stalls.append(
                        {
                            "at": time.time(),
                            "ms": round(dur * 1000, 1),
                            "top": run_stacks.most_common(4),
                        }
                    )
                run_start = None
            if time.time() - last_dump > 10:
                last_dump = time.time()
                try:
                    with open(OUT + ".tmp", "w") as fh:
                        json.dump({"stalls": stalls, "gaps": gaps, "gc": gcs}, fh)
                    os.replace(OUT + ".tmp", OUT)
                except Exception:
                    pass

    import atexit

    def _dump():
        with open(OUT, "w") as fh:
            json.dump({"stalls": stalls, "gaps": gaps, "gc": gcs}, fh)

    atexit.register(_dump)
    threading.Thread(target=_run, daemon=True, name="stall-tracer").start()
