"""How a reconcile run reports what it is doing: the `Progress` port (the CLI shows it with
rich), the timing of each stage, and Spark's task counts while the job runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Progress(Protocol):
    """Where a run reports what it is doing (the CLI shows it with rich)."""

    def stage(self, name: str, total: int | None = None) -> None:
        """A new stage begins; `total` units of work when known."""
        ...

    def advance(self, n: int) -> None:
        """`n` more units of the current stage are done."""
        ...

    def detail(self, text: str) -> None:
        """What the current stage is doing right now ("" clears it)."""
        ...


class NullProgress:
    """Reports nothing."""

    def stage(self, name: str, total: int | None = None) -> None:
        """Ignore."""

    def advance(self, n: int) -> None:
        """Ignore."""

    def detail(self, text: str) -> None:
        """Ignore."""


class StageTimer:
    """Times each stage of a run (seconds, in `timings`) and announces it to `progress`."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, key: str, label: str, total: int | None = None) -> Iterator[None]:
        self.progress.stage(label, total)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[key] = round(time.perf_counter() - t0, 3)


@contextmanager
def watch_spark(spark: SparkSession, progress: Progress) -> Iterator[None]:
    """Report the running Spark stages' task counts every half second."""
    stop = threading.Event()

    def loop() -> None:
        tracker = spark.sparkContext.statusTracker()
        while not stop.wait(0.5):
            try:
                ids = tracker.getActiveStageIds()
                done = total = 0
                for sid in ids:
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
            except Exception:  # the JVM is going away; progress is best effort
                return
            progress.detail(f"{len(ids)} stage(s) running, {done}/{total} tasks" if ids else "")

    watcher = threading.Thread(target=loop, name="spark-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=2.0)
        progress.detail("")
