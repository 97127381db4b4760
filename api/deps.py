"""FastAPI dependencies: the runtime and its parts as `Annotated` aliases.

`RuntimeDep` is the wired `api.runtime.Runtime` the lifespan built. `LeaderDep` is
the same but answers 421 on a follower and 503 while a new leader loads its map: every
endpoint that reads or changes leader state takes it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from api.runtime import Runtime
from metasrv.election import Election
from metasrv.kafka import KafkaAdmin
from metasrv.kv import KvBackend
from metasrv.locks import TopicLocks
from metasrv.mailbox import Mailbox
from metasrv.metrics import Metrics
from metasrv.registry import RegionRegistry
from metasrv.settings import Settings
from metasrv.topology import Topology


def get_runtime(request: Request) -> Runtime:
    """The runtime built by the lifespan."""
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_leader_runtime(request: Request) -> Runtime:
    """The runtime, if this process serves as leader (else 421 / 503)."""
    runtime: Runtime = request.app.state.runtime
    runtime.require_serving()
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
LeaderDep = Annotated[Runtime, Depends(get_leader_runtime)]


def _settings(request: Request) -> Settings:
    return get_runtime(request).settings


def _kv(request: Request) -> KvBackend:
    return get_runtime(request).kv


def _kafka(request: Request) -> KafkaAdmin:
    return get_runtime(request).kafka


def _locks(request: Request) -> TopicLocks:
    return get_runtime(request).locks


def _registry(request: Request) -> RegionRegistry:
    return get_runtime(request).registry


def _topology(request: Request) -> Topology:
    return get_runtime(request).topology


def _mailbox(request: Request) -> Mailbox:
    return get_runtime(request).mailbox


def _election(request: Request) -> Election:
    return get_runtime(request).election


def _metrics(request: Request) -> Metrics:
    return get_runtime(request).metrics


def _history(request: Request) -> Engine:
    return get_runtime(request).history


SettingsDep = Annotated[Settings, Depends(_settings)]
KvDep = Annotated[KvBackend, Depends(_kv)]
KafkaDep = Annotated[KafkaAdmin, Depends(_kafka)]
LocksDep = Annotated[TopicLocks, Depends(_locks)]
RegistryDep = Annotated[RegionRegistry, Depends(_registry)]
TopologyDep = Annotated[Topology, Depends(_topology)]
MailboxDep = Annotated[Mailbox, Depends(_mailbox)]
ElectionDep = Annotated[Election, Depends(_election)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
HistoryDep = Annotated[Engine, Depends(_history)]
