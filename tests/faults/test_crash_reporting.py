"""Found by the fault suite: a heartbeat racing a datanode crash reported a killed region
as idle (`topic_latest_entry_id` = the topic's latest id, memtable 0), the leader purged
past the region's unflushed rows, and the replay after the restart lost them."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from toolbox.simulator import SimRegion, WalWriter


def test_killed_region_is_never_idle(tmp_path: Path) -> None:
    # The writer is never used: nothing is written.
    region = SimRegion(7, "t_0", tmp_path, cast(WalWriter, None))
    token = region.idle_token()
    assert token is not None  # a fresh region has nothing unflushed
    region.kill()
    # The heartbeat thread took its token before the crash and reads offsets after it.
    assert region.idle_token() is None
    region.observe_latest(token, 100)
    assert region.stat().topic_latest_entry_id is None
