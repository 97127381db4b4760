"""A purge survives the Kafka broker stopping mid-run: it retries, then succeeds.

THE ONE TEST THAT STOPS THE SHARED KAFKA BROKER. It is marked `faults`, keeps the outage
as short as a clean stop/start allows, and restarts the broker in a `finally` whatever
happens (the tests after it use the same broker). It is skipped when the broker was
not started by this checkout's stack (e.g. METASRV_TEST_KAFKA points elsewhere).
"""

from __future__ import annotations

import asyncio
import os

import pytest

from procedures import ProcedureState
from procedures.wal_purge import submit_purges
from tests._wait import eventually
from tests.procedures.conftest import HarnessFactory
from toolbox.stack import StackConfig, service_pid, start_service, stop_service

pytestmark = pytest.mark.faults


@pytest.fixture
def stack_config(kafka_bootstrap: str) -> StackConfig:
    cfg = StackConfig.from_env()
    if os.environ.get("METASRV_TEST_KAFKA") or service_pid(cfg, "kafka") is None:
        pytest.skip("Kafka was not started by this checkout's stack; not stopping it")
    return cfg


@pytest.mark.timeout(300)
async def test_broker_stopped_mid_purge_retries_then_succeeds(
    harness_factory: HarnessFactory, stack_config: StackConfig
) -> None:
    h = await harness_factory(
        wal={"flush_trigger_size": "1KB", "flush_wait_timeout": "2s"},
        procedure={"retry_delay": "500ms", "max_retry_times": 12},
    )
    topic = h.topic(0)
    await h.register(1, topic)
    h.produce(topic, 100)
    h.report_topic(topic, 99, record_size=100 * 100, record_num=100)
    h.report(1, topic, flushed=30)

    async def heartbeats() -> None:
        # The datanode keeps reporting through the outage, so its stat stays fresh.
        while True:
            h.report(1, topic, flushed=30)
            await asyncio.sleep(1.0)  # the datanode's heartbeat period

    async def in_retry() -> bool:
        return (await h.manager.get(pid)).state is ProcedureState.RETRYING

    beating = asyncio.create_task(heartbeats())
    [pid] = await submit_purges(h.manager, [topic], reason="outage")
    try:
        await eventually(lambda: h.at_step(pid, "flush"), "the purge at its flush step")
        try:
            # The purge is waiting for its flush; the broker goes away under it.
            await asyncio.to_thread(stop_service, stack_config, "kafka")
            await eventually(
                in_retry, "the purge retrying for the outage", timeout=120, interval=0.2
            )
            retrying = await h.manager.get(pid)
            assert retrying.error_code == "kafka_unavailable", retrying
            assert h.marker(topic) is None
        finally:
            await asyncio.to_thread(start_service, stack_config, "kafka")
        view = await h.manager.wait(pid, 180)
    finally:
        beating.cancel()
    assert view.state is ProcedureState.SUCCEEDED, view
    assert sum(s.attempts for s in view.steps) > len(view.steps)
    assert h.offsets(topic).log_start_offset == 30
    assert h.marker(topic) == 30
    assert h.readable(topic, 31)
