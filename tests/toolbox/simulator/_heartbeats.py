"""Waiting on a simulated datanode's heartbeats."""

from __future__ import annotations

from tests._wait import wait_until
from toolbox.simulator import SimDatanode


def reported(datanode: SimDatanode) -> None:
    """Return once a heartbeat built after this call was answered: the metasrv has every
    region's state as it is now (the heartbeat under way may have been built before)."""
    since = datanode.heartbeats_sent
    wait_until(lambda: datanode.heartbeats_sent >= since + 2, "a heartbeat of the current state")
