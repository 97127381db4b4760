"""A purge its leader left half done: the state a resumed purge step starts from."""

from __future__ import annotations

import time
import uuid

import orjson

from metasrv import keys
from procedures import ProcedureRecord, ProcedureState, state_key
from procedures.wal_purge import PurgeData, advance_marker
from tests.procedures._harness import Harness
from tests.procedures.conftest import HarnessFactory


async def died_before_delete(
    factory: HarnessFactory, target: int = 70, entries: int = 100
) -> tuple[Harness, str, str]:
    """A leader with no pins planned P = `target` on topic 0 (one region, `entries` entries),
    persisted it as its purge's target and moved the marker there, then died before
    DeleteRecords: the procedure is stored RUNNING at its purge step, holding the topic's
    lock. Returns the closed harness (its `bootstrap` and `kv` still answer), the topic and
    the procedure's id; the next harness's manager resumes it."""
    old = await factory()
    topic = old.topic(0)
    await old.register(1, topic)
    old.produce(topic, entries)
    topic_id = old.offsets(topic).topic_id
    await advance_marker(old.services, topic, target, topic_id=topic_id)
    pid = uuid.uuid4().hex
    data = PurgeData(topic, prune_point=target, previous_pruned_entry_id=None, log_start_offset=0,
                     high_watermark=entries, topic_id=topic_id, target=target)  # fmt: skip
    record = ProcedureRecord(
        id=pid,
        kind="wal_purge",
        topic=topic,
        state=ProcedureState.RUNNING,
        step="purge",
        attempts=0,
        reason="test",
        data=data.to_json(),
        submitted_at=time.time() - 5,
        started_at=time.time() - 5,
        kv_locks=(keys.lock(topic),),
    )
    old.kv.put(state_key(pid), record.to_json())
    old.kv.put(keys.lock(topic), orjson.dumps({"procedure_id": pid}))  # as the store writes it
    await old.close()
    return old, topic, pid
