"""Producing as fast as the broker takes it: the load a producer-throughput figure measures."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Message, Producer


def produce_for(
    producer: Producer,
    topics: list[str],
    seconds: float,
    value: Callable[[int], bytes],
    on_delivery: Callable[[Any, Message], None],
    flush_timeout: float = 120.0,
) -> float:
    """Produce `value(n)` to partition 0 of `topics` (round-robin) as fast as `producer` takes
    records for `seconds`, then flush; the seconds taken, the flush included. Deliveries are
    counted by `on_delivery`."""
    t0 = time.monotonic()
    deadline = t0 + seconds
    n = 0
    while time.monotonic() < deadline:
        try:
            topic = topics[n % len(topics)]
            producer.produce(topic, value(n), partition=0, on_delivery=on_delivery)
            n += 1
            if n % 500 == 0:
                producer.poll(0)
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.05)
    producer.flush(flush_timeout)
    return time.monotonic() - t0
