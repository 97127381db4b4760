"""Key-value backends (etcd, SQL) behind one protocol."""

from metasrv.kv._protocol import (
    Compare,
    Delete,
    KeyValue,
    KvBackend,
    Put,
    TxnOp,
    TxnResult,
)
from metasrv.kv._sql import SqlKv

__all__ = [
    "Compare",
    "Delete",
    "KeyValue",
    "KvBackend",
    "Put",
    "SqlKv",
    "TxnOp",
    "TxnResult",
]
