"""Region routes: register, remove, inspect, replay start (DESIGN §5)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from api import answers, queries
from api.auth import RequireOperator, RequireReplay, RequireViewer
from api.deps import LeaderDep
from api.wire_http import ERROR_RESPONSES, TopicQuery, answer, body_of, gives, takes
from metasrv import wire
from metasrv.model import ID_MAX

router = APIRouter(tags=["regions"], responses=ERROR_RESPONSES)

RegionIdPath = Annotated[int, Path(ge=0, le=ID_MAX, description="64-bit region id")]


@router.post(
    "/v1/regions",
    status_code=201,
    dependencies=[RequireOperator],
    summary="Register a region on a topic (least-loaded pool topic unless named)",
    response_class=Response,
    responses={
        201: gives(wire.RegisteredRegion, "Registered (or already registered there)."),
        404: {},
        409: {"description": "Already registered on another topic."},
    },
    openapi_extra=takes(wire.RegisterRegion),
)
async def register_region(
    runtime: LeaderDep,
    body: Annotated[wire.RegisterRegion, Depends(body_of(wire.RegisterRegion))],
) -> Response:
    """Idempotent for the same region and topic; creates the Kafka topic on first use."""
    route = await runtime.register_region(body.region_id, body.node_id, body.topic)
    registered = wire.RegisteredRegion(
        region_id=route.region_id, topic=route.topic, node_id=route.node_id
    )
    return answer(registered, 201)


@router.delete(
    "/v1/regions/{region_id}",
    status_code=204,
    dependencies=[RequireOperator],
    summary="Remove a region from the topic-region map",
    response_class=Response,
    responses={404: {"description": "Region not registered."}},
)
async def deregister_region(region_id: RegionIdPath, runtime: LeaderDep) -> Response:
    """Remove the route, its stat and its checkpoint key."""
    await runtime.deregister_region(region_id)
    return Response(status_code=204)


@router.get(
    "/v1/regions",
    dependencies=[RequireViewer],
    summary="Registered regions, ordered by id",
    response_class=Response,
    responses={200: gives(wire.RegionList, "Regions, up to `limit`.")},
)
async def list_regions(
    runtime: LeaderDep,
    topic: TopicQuery = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> Response:
    """Every region (or one topic's), up to `limit`."""
    views = await queries.region_views(runtime, topic, limit)
    return answer(wire.RegionList(regions=[answers.region(v) for v in views]))


@router.get(
    "/v1/regions/{region_id}",
    dependencies=[RequireViewer],
    summary="A region's route, latest stat, prunable id and replay start",
    response_class=Response,
    responses={
        200: gives(wire.Region, "What the leader knows about the region now."),
        404: {"description": "Region not registered."},
        500: {"description": "`damaged_marker`: the topic's stored marker does not decode."},
    },
)
async def get_region(region_id: RegionIdPath, runtime: LeaderDep) -> Response:
    return answer(answers.region(await queries.region_view(runtime, region_id)))


@router.get(
    "/v1/regions/{region_id}/replay-start",
    dependencies=[RequireReplay],
    summary="Entry id a restarting region replays its WAL from",
    response_class=Response,
    responses={
        200: gives(wire.ReplayStart, "Where to replay from."),
        404: {"description": "Region not registered."},
        409: {
            "description": "`topic_reset`: the region's topic was deleted and recreated or "
            "truncated under metasrv; no offset is answered until an operator resolves it."
        },
        500: {
            "description": "`damaged_marker`: the topic's stored marker does not decode; "
            "`object_store_rejected`: the WAL archive's store refused metasrv's listing."
        },
        503: {
            "description": "`object_store_unavailable`: the start is below Kafka's log "
            "start and the WAL archive's store did not answer; retry (Retry-After)."
        },
    },
)
async def replay_start(region_id: RegionIdPath, runtime: LeaderDep) -> Response:
    """`max(prunable_entry_id, pruned_entry_id, target of an unfinished purge) + 1`; the
    prunable id from the live stat, else the last checkpoint, else -1. A datanode reads from
    `max(this, its own flushed_entry_id + 1)` (docs/protocol.md, "Replay"). Below Kafka's
    log start, `archive` lists the WAL archive's objects to replay first (DESIGN §8)."""
    return answer(answers.replay_start(await queries.replay_start(runtime, region_id)))
