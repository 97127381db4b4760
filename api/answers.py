"""The daemon's values as wire answers (`metasrv.wire`): plans, regions, topics, procedures."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from api.queries import RegionView, ReplayStart, TopicView
from metasrv import wire
from metasrv.model import TopicPlan
from procedures import ProcedureView
from procedures.wal_purge import TrendSampler


def _at(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


def replay_start(start: ReplayStart) -> wire.ReplayStart:
    return wire.ReplayStart(
        region_id=start.region_id,
        topic=start.topic,
        start_entry_id=start.start_entry_id,
        log_start_offset=start.log_start_offset,
        archive=None
        if start.archive is None
        else [
            wire.ArchivedObject(
                bucket=o.bucket,
                key=o.key,
                first_entry_id=o.entries.first_entry_id,
                last_entry_id=o.entries.last_entry_id,
            )
            for o in start.archive
        ],
    )


def region(view: RegionView) -> wire.Region:
    stat = view.stat
    route = view.route
    return wire.Region(
        region_id=route.region_id,
        topic=route.topic,
        node_id=route.node_id,
        checkpoint_entry_id=route.checkpoint_entry_id,
        stat=None
        if stat is None
        else wire.RegionStat(
            node_id=stat.node_id,
            flushed_entry_id=stat.flushed_entry_id,
            topic_latest_entry_id=stat.topic_latest_entry_id,
            memtable_bytes=stat.memtable_bytes,
            manifest_version=stat.manifest_version,
            prunable_entry_id=stat.prunable_entry_id,
            idle_claim_ignored=stat.idle_claim_ignored,
            age_seconds=round(view.stat_age or 0.0, 3),
        ),
        prunable_entry_id=None if stat is None else stat.prunable_entry_id,
        pruned_entry_id=view.pruned_entry_id,
        replay_start_entry_id=view.replay_start_entry_id,
    )


def plan(p: TopicPlan) -> wire.TopicPlan:
    return wire.TopicPlan(
        topic=p.topic,
        prune_point=p.prune_point,
        pruned_entry_id=p.pruned_entry_id,
        log_start_offset=p.log_start_offset,
        high_watermark=p.high_watermark,
        blocked_by=[
            *(
                wire.BlockingRegion(region_id=b.region_id, reason=wire.BlockReason(b.reason))
                for b in p.blocked_by
            ),
            *(
                wire.BlockingRegion(
                    consumer_group=group, reason=wire.BlockReason.NO_COMMITTED_OFFSET
                )
                for group in p.blocking_groups
            ),
            *(
                [wire.BlockingRegion(topic=p.topic, reason=wire.BlockReason.NOT_ARCHIVED)]
                if p.not_archived is not None
                else []
            ),
        ],
        reclaimable_entries=p.reclaimable_entries,
        data_loss=list(p.data_loss),
        region_count=p.region_count,
        kafka_unavailable=p.kafka_unavailable,
        topic_reset=p.topic_reset,
        topic_id=p.topic_id,
        not_archived=p.not_archived,
        pinned_groups=[
            wire.PinnedGroup(
                consumer_group=g.group,
                committed_offset=g.committed_offset,
                lag=g.lag,
                holds_prune_point=g.holds,
            )
            for g in p.pinned_groups
        ],
    )


def topic(view: TopicView) -> wire.Topic:
    stat, durable = view.stat, view.durability
    return wire.Topic(
        **msgspec.structs.asdict(plan(view.plan)),
        pool=view.pool,
        latest_entry_id=None if stat is None else stat.latest_entry_id,
        avg_record_size=None if stat is None else round(stat.avg_record_size, 3),
        replication_factor=None if durable is None else durable.replication_factor,
        min_insync_replicas=None if durable is None else durable.min_insync_replicas,
    )


def procedure(view: ProcedureView) -> wire.Procedure:
    return wire.Procedure(
        id=view.id,
        kind=view.kind,
        topic=view.topic,
        state=wire.ProcedureState(view.state),
        step=view.step or None,
        attempts=view.attempts,
        error=view.error,
        error_code=view.error_code,
        reason=view.reason,
        outcome=view.outcome,
        submitted_at=datetime.fromtimestamp(view.submitted_at, tz=UTC),
        started_at=_at(view.started_at),
        finished_at=_at(view.finished_at),
        timings=dict(view.timings),
        data=dict(view.data),
    )


def wal_trend(sampler: TrendSampler, *, topic: str | None, top: int | None) -> wire.WalTrend:
    view = sampler.ring.view(topics=None if topic is None else (topic,), top=top)
    return wire.WalTrend(
        sample_interval_s=sampler.sample_interval,
        window_s=sampler.window,
        at=list(view.times),
        total_entries=list(view.total_entries),
        total_bytes=list(view.total_bytes),
        topic_count=view.topics,
        topics=[
            wire.TrendSeries(topic=s.topic, entries=list(s.entries), bytes=list(s.bytes))
            for s in view.series
        ],
        purges=[
            wire.TrendPurge(
                at=m.at,
                topic=m.topic,
                procedure_id=m.procedure_id,
                prune_point=m.prune_point,
                entries_deleted=m.entries_deleted,
                bytes_estimated=m.bytes_estimated,
                logical_delete=m.logical_delete,
            )
            for m in view.purges
        ],
    )
