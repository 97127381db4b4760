"""Build the configured kv backend (DESIGN §6 `[kv]`)."""

from __future__ import annotations

from metasrv.kv._etcd import EtcdKv
from metasrv.kv._etcd_security import EtcdSecurity
from metasrv.kv._protocol import KvBackend
from metasrv.kv._sql import SqlKv
from metasrv.settings import Settings


def open_kv(settings: Settings) -> KvBackend:
    """Open the kv backend named by `settings.kv.backend`.

    SQLite files are migrated to the current schema on open, so a bare `metasrv start`
    works with no setup; PostgreSQL needs `metasrv db upgrade` first.
    """
    cfg = settings.kv
    if cfg.backend == "etcd":
        return EtcdKv(cfg.etcd_endpoints, cfg.key_prefix, security=EtcdSecurity.from_settings(cfg))
    return SqlKv.open(cfg.sql_url, cfg.key_prefix, create=True)
