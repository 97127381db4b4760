"""Region stats put in a leader's registry the way heartbeats put them: through a
columns heartbeat, judged (`HeartbeatJudge`) and stored (`Judged.store`), the one write
path there is."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from metasrv import wire
from metasrv.leader import HeartbeatJudge, RegionRegistry
from metasrv.model import RegionRoute, RegionStat

HEARTBEAT_REGIONS = 10_000
"""Regions per heartbeat (a datanode's are sent in as many as it takes)."""


@dataclass(frozen=True)
class Routes:
    """What the judge reads of a topic-region map: region id -> route."""

    routes: Mapping[int, RegionRoute]


def own_routes(stats: Iterable[RegionStat]) -> dict[int, RegionRoute]:
    """Each stat's region routed to the topic and datanode the stat names."""
    return {s.region_id: RegionRoute(s.region_id, s.topic, s.node_id, None) for s in stats}


def report(
    registry: RegionRegistry,
    stats: Iterable[RegionStat],
    routes: Mapping[int, RegionRoute] | None = None,
) -> None:
    """Store `stats` as their datanodes' heartbeats do: the stats one datanode sent at
    one time (`received_at`) in one columns heartbeat, judged against `routes` (by
    default, `own_routes`) and stored. A region the judge rejects fails the caller."""
    listed = list(stats)
    judge = HeartbeatJudge(
        registry, Routes(own_routes(listed) if routes is None else routes), keep_misrouted=False
    )
    beats: dict[tuple[int, float], list[RegionStat]] = {}
    for stat in listed:
        beats.setdefault((stat.node_id, stat.received_at), []).append(stat)
    for (node_id, received_at), sent in beats.items():
        for start in range(0, len(sent), HEARTBEAT_REGIONS):
            body = wire.encode_columns(
                node_id,
                None,
                [
                    (
                        s.region_id,
                        s.topic,
                        s.flushed_entry_id,
                        s.topic_latest_entry_id,
                        s.memtable_bytes,
                        s.manifest_version,
                    )
                    for s in sent[start : start + HEARTBEAT_REGIONS]
                ],
            )
            judged = judge.columns(node_id, wire.columns_of(wire.decode_columns(body)), received_at)
            if judged.rejected:
                raise AssertionError(f"the judge rejected {judged.rejected}")
            judged.store(received_at)


def prepared_for(registry: RegionRegistry, topic: str, region_ids: list[int]) -> list[int]:
    """Those of `region_ids` whose slot was prepared for `topic` (`RegionRegistry.prepare`)
    and that have no row yet: what the judge takes as the map's word for a first report
    of them on `topic` (`Verdict.prepared`). Judged for no datanode (-1), which no memo
    holds, and nothing is stored."""
    n = len(region_ids)
    cols = wire.Columns(
        topic_names=[topic],
        topic=np.zeros(n, np.int64),
        region_id=np.array(region_ids, np.int64),
        flushed=np.zeros(n, np.int64),
        memtable=np.zeros(n, np.int64),
        latest=None,
        manifest=None,
    )
    prepared = registry.judge(-1, cols).prepared(np.arange(n))
    return [rid for rid, yes in zip(region_ids, prepared.tolist(), strict=True) if yes]
