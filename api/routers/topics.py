"""Topic views and the prune plan (DESIGN §5 read side)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from api import answers, queries, topic_reset
from api.auth import RequireOperator, RequireViewer
from api.deps import LeaderDep
from api.wire_http import ERROR_RESPONSES, TopicPath, TopicQuery, answer, body_of, gives, takes
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
        500: {"description": "`damaged_marker`: the topic's stored marker does not decode."},
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
        500: {
            "description": "`damaged_marker`: the named topic's stored marker does not decode "
            "(the list of every topic shows it as never purged and logs it)."
        },
    },
)
async def purge_plan(runtime: LeaderDep, topic: TopicQuery = None) -> Response:
    """The pure planner over the current map, stats, markers and Kafka offsets."""
    plans = await queries.compute_plans(runtime, None if topic is None else [topic])
    return answer(wire.PlanList(topics=[answers.plan(p) for p in plans.values()]))


@router.post(
    "/v1/topics/{topic}/resolve-reset",
    dependencies=[RequireOperator],
    summary="Resolve a topic reset (the topic was deleted and recreated, or truncated)",
    response_class=Response,
    responses={
        200: gives(wire.ResetResolved, "Resolved: every region of the topic reports again."),
        404: {"description": "Neither a pool topic nor a topic with regions."},
        409: {
            "description": "No reset latched, no such topic in Kafka, or `topic_id` is not "
            "Kafka's id of it now."
        },
    },
    openapi_extra=takes(wire.ResolveReset),
)
async def resolve_reset(
    topic: TopicPath,
    runtime: LeaderDep,
    body: Annotated[wire.ResolveReset, Depends(body_of(wire.ResolveReset))],
) -> Response:
    """Only once the topic's regions replay from the new topic (their datanodes rebuilt
    them from their own storage): the marker is cleared and records `topic_id`, and the
    regions' stats and checkpoints start again from their next reports."""
    done = await topic_reset.resolve_reset(runtime, topic, body.topic_id)
    previous = done.previous
    return answer(
        wire.ResetResolved(
            topic=done.topic,
            topic_id=done.topic_id,
            regions=done.regions,
            previous_pruned_entry_id=previous.pruned_entry_id,
            reset_reason=previous.reset.reason if previous.reset is not None else "",
        )
    )
