"""Topic views and the prune plan (DESIGN §5 read side)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api import answers, queries
from api.auth import RequireViewer
from api.deps import LeaderDep
from api.wire_http import ERROR_RESPONSES, TopicPath, TopicQuery, answer, gives
from metasrv import wire

router = APIRouter(tags=["topics"], dependencies=[RequireViewer], responses=ERROR_RESPONSES)


@router.get(
    "/v1/topics",
    summary="Every WAL topic with its regions, offsets and prune point",
    response_class=Response,
    responses={200: gives(wire.TopicList, "Pool topics and any other topic with regions.")},
)
async def list_topics(runtime: LeaderDep) -> Response:
    """Kafka offsets in one batched call."""
    views = await queries.topic_views(runtime)
    return answer(wire.TopicList(topics=[answers.topic(v) for v in views]))


@router.get(
    "/v1/topics/{topic}",
    summary="One topic",
    response_class=Response,
    responses={
        200: gives(wire.Topic, "Regions count, latest entry id, pruned id, prune point, blockers."),
        404: {"description": "Neither a pool topic nor a topic with regions."},
    },
)
async def get_topic(topic: TopicPath, runtime: LeaderDep) -> Response:
    (view,) = await queries.topic_views(runtime, [topic])
    return answer(answers.topic(view))


@router.get(
    "/v1/purge/plan",
    summary="Where each topic may be purged now, and what blocks it",
    response_class=Response,
    responses={
        200: gives(wire.PlanList, "The plan a purge started now would follow."),
        404: {"description": "Unknown topic."},
    },
)
async def purge_plan(runtime: LeaderDep, topic: TopicQuery = None) -> Response:
    """The pure planner over the current map, stats, markers and Kafka offsets."""
    plans = await queries.compute_plans(runtime, None if topic is None else [topic])
    return answer(wire.PlanList(topics=[answers.plan(p) for p in plans.values()]))
