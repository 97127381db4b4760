"""The kv contract suite's per-backend store (etcd, PostgreSQL, SQLite), for the follower."""

from tests.metasrv.kv.conftest import kv_store

__all__ = ["kv_store"]
