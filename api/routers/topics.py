"""Topic views and the prune plan (DESIGN §5 read side)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api import queries
from api.auth import RequireViewer
from api.deps import LeaderDep
from api.models import ERROR_RESPONSES, PlanList, TopicList, TopicName, TopicOut, TopicPlanOut

router = APIRouter(tags=["topics"], dependencies=[RequireViewer], responses=ERROR_RESPONSES)


@router.get("/v1/topics", summary="Every WAL topic with its regions, offsets and prune point")
async def list_topics(runtime: LeaderDep) -> TopicList:
    """Pool topics and any other topic with regions; Kafka offsets in one batched call."""
    views = await queries.topic_views(runtime)
    return TopicList(topics=[TopicOut.of_view(v) for v in views])


@router.get(
    "/v1/topics/{topic}",
    summary="One topic",
    responses={404: {"description": "Neither a pool topic nor a topic with regions."}},
)
async def get_topic(topic: Annotated[TopicName, Path()], runtime: LeaderDep) -> TopicOut:
    """One topic's regions count, latest entry id, pruned id, prune point, blockers."""
    (view,) = await queries.topic_views(runtime, [topic])
    return TopicOut.of_view(view)


@router.get(
    "/v1/purge/plan",
    summary="Where each topic may be purged now, and what blocks it",
    responses={404: {"description": "Unknown topic."}},
)
async def purge_plan(
    runtime: LeaderDep, topic: Annotated[TopicName | None, Query()] = None
) -> PlanList:
    """The pure planner over the current map, stats, markers and Kafka offsets."""
    plans = await queries.compute_plans(runtime, None if topic is None else [topic])
    return PlanList(topics=[TopicPlanOut.of(p) for p in plans.values()])
