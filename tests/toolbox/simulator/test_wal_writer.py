"""The simulator's WAL writer against the real broker: its delivery-report thread outlives
a failing callback (a dead poll thread once left writes in flight forever and pinned every
purge behind them after a broker restart)."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, Message

from toolbox.simulator import WalWriter


def test_a_raising_delivery_callback_does_not_stop_later_reports(
    kafka_bootstrap: str, kafka_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    writer = WalWriter(kafka_bootstrap, client_id="test-wal-writer")
    delivered: list[int] = []
    done = threading.Event()

    def explode(err: KafkaError | None, msg: Message) -> None:
        raise RuntimeError("callback bug")

    def record(err: KafkaError | None, msg: Message) -> None:
        assert err is None
        offset = msg.offset()
        assert offset is not None
        delivered.append(offset)
        done.set()

    try:
        writer.produce(kafka_topic, b"1", b"first", explode)
        writer.produce(kafka_topic, b"1", b"second", record)
        assert done.wait(30), "the second delivery report never came"
        assert delivered == [1]
        assert "a delivery callback failed; serving on" in caplog.text
        assert writer.counters()[kafka_topic].record_num == 2
    finally:
        assert writer.close() == 0
