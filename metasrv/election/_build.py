"""The election a configuration asks for, and the address this process advertises."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from metasrv.election._etcd import EtcdElection
from metasrv.election._protocol import Election
from metasrv.election._single import SingleLeader, SqliteFileLeader
from metasrv.election._sql import SqlElection
from metasrv.kv import EtcdKv, KvBackend, SqlKv
from metasrv.settings import WILDCARD_HOSTS, Settings, split_host_port
from metasrv.sql import is_sqlite, sqlite_file

logger = logging.getLogger(__name__)


def advertised_addr(settings: Settings) -> str:
    """The HTTP address other processes should use for this one (`host:port`):
    `http.advertise_addr`, else `http.addr`, whose wildcard host (which nobody can
    reach) is replaced by this host's name, with a warning to set `advertise_addr`."""
    if settings.http.advertise_addr:
        return settings.http.advertise_addr
    parsed = split_host_port(settings.http.addr)
    if parsed is None:  # not host:port: `metasrv start` refuses it before anyone asks
        return settings.http.addr
    host, port = parsed
    if host in WILDCARD_HOSTS:
        host = socket.gethostname()
        logger.warning(
            "http.addr binds every interface and http.advertise_addr is unset: followers "
            "will name this process %s:%s; set http.advertise_addr to an address other "
            "processes and datanodes can reach",
            host,
            port,
        )
    return f"{host}:{port}"


def build_election(
    settings: Settings,
    kv: KvBackend,
    *,
    addr: str | None = None,
    loop_stalled_for: Callable[[], float] | None = None,
) -> Election:
    """`EtcdElection` on etcd, `SqlElection` on PostgreSQL, `SqliteFileLeader` on a
    SQLite file (one process per file), `SingleLeader` on an in-memory SQLite kv.
    `loop_stalled_for` (seconds since the event loop last ran) arms the leader's watchdog."""
    addr = addr or advertised_addr(settings)
    if isinstance(kv, EtcdKv):
        return EtcdElection(
            kv,
            node_name=settings.node_name,
            addr=addr,
            lease_secs=settings.election.lease_secs,
            loop_stalled_for=loop_stalled_for,
        )
    if isinstance(kv, SqlKv) and is_sqlite(kv.url):
        database = sqlite_file(kv.url)
        if database is None:  # in memory: no other process can reach it
            return SingleLeader(node_name=settings.node_name, addr=addr)
        return SqliteFileLeader(database, node_name=settings.node_name, addr=addr)
    if isinstance(kv, SqlKv):
        return SqlElection(
            kv.url,
            kv.key_prefix,
            node_name=settings.node_name,
            addr=addr,
            lease_secs=settings.election.lease_secs,
            loop_stalled_for=loop_stalled_for,
        )
    return SingleLeader(node_name=settings.node_name, addr=addr)
