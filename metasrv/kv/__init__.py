"""Key-value backends (etcd, SQL) behind one protocol."""

from metasrv.kv._etcd import EtcdKv, translate_etcd_error
from metasrv.kv._etcd_members import EtcdMembers
from metasrv.kv._etcd_members import Stubs as EtcdStubs
from metasrv.kv._etcd_security import EtcdSecurity
from metasrv.kv._factory import open_kv
from metasrv.kv._protocol import (
    BatchUpdate,
    Compare,
    Delete,
    KeyPage,
    KeyValue,
    KvBackend,
    KvChange,
    KvWatch,
    Put,
    Snapshot,
    TxnOp,
    TxnResult,
    WatchLost,
)
from metasrv.kv._sql import SqlKv

__all__ = [
    "BatchUpdate",
    "Compare",
    "Delete",
    "EtcdKv",
    "EtcdMembers",
    "EtcdSecurity",
    "EtcdStubs",
    "KeyPage",
    "KeyValue",
    "KvBackend",
    "KvChange",
    "KvWatch",
    "Put",
    "Snapshot",
    "SqlKv",
    "TxnOp",
    "TxnResult",
    "WatchLost",
    "open_kv",
    "translate_etcd_error",
]
