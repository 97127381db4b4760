"""A leader process that runs one WAL purge and freezes at a chosen point, to be SIGKILLed.

`python -m tests.procedures._runner SPEC.json` builds the real procedure stack on etcd and
Kafka (tests/procedures/_harness.py), becomes leader, puts the spec's region stats into
its registry (as heartbeats would), submits a purge of the spec's topic, and runs it.

The kill point is deterministic: the kv backend and the Kafka adapter are wrapped so
that right after the chosen write has completed — the procedure record persisted after
prepare, after the flush instructions were sent, with the purge intent; the marker CAS
committed; DeleteRecords returned — the calling thread writes the spec's `signal_file`
and blocks forever. Nothing after that point can happen before the test kills us.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import orjson

from metasrv import keys
from metasrv.kafka import KafkaAdmin
from metasrv.kv import (
    BatchUpdate,
    Compare,
    EtcdKv,
    KeyValue,
    KvBackend,
    KvChange,
    KvWatch,
    Put,
    Snapshot,
    TxnOp,
    TxnResult,
)
from procedures import ProcedureRecord
from procedures.wal_purge import submit_purges
from tests.procedures._harness import Harness, make_settings

KILL_POINTS = ("after_prepare", "after_flush_sent", "after_intent", "after_marker", "after_delete")


def freeze(signal_file: str, point: str) -> None:
    """Tell the test where we stopped, then never return."""
    tmp = signal_file + ".tmp"
    Path(tmp).write_text(json.dumps({"point": point, "pid": os.getpid()}))
    os.replace(tmp, signal_file)
    threading.Event().wait()  # until the test's SIGKILL


def _persisted_record(ops: Sequence[TxnOp]) -> ProcedureRecord | None:
    for op in ops:
        if isinstance(op, Put) and op.key.startswith(keys.PROCEDURE_PREFIX):
            return ProcedureRecord.from_json(op.value)
    return None


class FreezingKv:
    """A `KvBackend` that freezes after the transaction matching the kill point commits."""

    def __init__(self, inner: KvBackend, point: str, signal_file: str) -> None:
        self._inner = inner
        self._point = point
        self._signal = signal_file
        self.max_txn_ops = inner.max_txn_ops

    def _matches(self, ops: Sequence[TxnOp]) -> bool:
        record = _persisted_record(ops)
        if self._point == "after_marker":
            return any(isinstance(o, Put) and o.key.startswith(keys.TOPIC_NAME_PREFIX) for o in ops)
        if record is None:
            return False
        if self._point == "after_prepare":
            return record.step != "prepare"
        if self._point == "after_flush_sent":
            return record.data.get("flush_sent_at") is not None
        if self._point == "after_intent":
            return record.data.get("target") is not None
        return False

    def txn(
        self, compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()
    ) -> TxnResult:
        result = self._inner.txn(compares, success, failure)
        if result.succeeded and self._matches(success):
            freeze(self._signal, self._point)
        return result

    def get(self, key: str) -> KeyValue | None:
        return self._inner.get(key)

    def range(
        self, prefix: str, *, start_after: str | None = None, limit: int = 1000
    ) -> list[KeyValue]:
        return self._inner.range(prefix, start_after=start_after, limit=limit)

    def scan(self, prefix: str, *, page_size: int = 1000) -> Iterator[KeyValue]:
        return self._inner.scan(prefix, page_size=page_size)

    def snapshot(self) -> AbstractContextManager[Snapshot]:
        return self._inner.snapshot()

    def watch(
        self, prefix: str, after_revision: int, *, holds_after: Callable[[list[KvChange]], int]
    ) -> KvWatch:
        return self._inner.watch(prefix, after_revision, holds_after=holds_after)

    def put(self, key: str, value: bytes) -> int:
        return self._inner.put(key, value)

    def delete(self, key: str) -> bool:
        return self._inner.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        return self._inner.delete_prefix(prefix)

    def batch_put(self, items: Sequence[tuple[str, bytes]]) -> None:
        self._inner.batch_put(items)

    def batch_update(
        self, items: Sequence[tuple[str, bytes]], fence: Sequence[Compare]
    ) -> BatchUpdate:
        return self._inner.batch_update(items, fence)

    def close(self) -> None:
        self._inner.close()


class FreezingKafka(KafkaAdmin):
    """Kafka adapter that freezes right after DeleteRecords returns (kill point `after_delete`)."""

    def __init__(self, bootstrap: str, on_delete: Callable[[], None]) -> None:
        super().__init__(bootstrap)
        self._on_delete = on_delete

    def delete_records(self, targets: Mapping[str, int]) -> dict[str, int]:
        result = super().delete_records(targets)
        self._on_delete()
        return result


async def main(spec: dict[str, Any]) -> None:
    point: str = spec["kill_point"]
    if point not in KILL_POINTS:
        raise SystemExit(f"unknown kill point {point}")
    settings = make_settings(
        kafka=spec["kafka"],
        etcd=spec["etcd"],
        prefix=spec["prefix"],
        wal=spec.get("wal"),
        procedure=spec.get("procedure"),
    )
    signal = spec["signal_file"]
    kv = FreezingKv(EtcdKv([spec["etcd"]], f"{spec['prefix']}/"), point, signal)
    kafka = FreezingKafka(
        spec["kafka"],
        (lambda: freeze(signal, point)) if point == "after_delete" else (lambda: None),
    )
    h = Harness(settings, spec["history_url"], name="runner", kv=kv, kafka=kafka)
    await h.start(wait_leader=60)
    topic = spec["topic"]
    for r in spec["regions"]:
        h.report(r["region_id"], topic, r["flushed"], latest=r.get("latest"), node_id=r["node_id"])
    if spec.get("topic_stat"):
        ts = spec["topic_stat"]
        h.report_topic(
            topic, ts["latest"], record_size=ts["record_size"], record_num=ts["record_num"]
        )
    [pid] = await submit_purges(h.manager, [topic], reason="crash-test")
    view = await h.manager.wait(pid, 120)
    # Reaching here means the kill point was never hit: say so loudly.
    Path(signal).write_text(json.dumps({"point": "finished", "state": view.state.value}))
    await h.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(orjson.loads(Path(sys.argv[1]).read_bytes())))
