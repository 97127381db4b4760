"""Who leads: one leader among metasrv processes, elected with a lease through the kv backend
(etcd or PostgreSQL), and the fence every leader-only write carries (DESIGN §4).

`build_election` picks the backend's election: `EtcdElection` (`_etcd.py`) and `SqlElection`
(`_sql.py`) share the lease thread and its watchdog (`_lease.py`); a SQLite kv has a
single-process leader (`_single.py`). Every one satisfies `Election` (`_protocol.py`).
"""

from metasrv.election._build import advertised_addr, build_election
from metasrv.election._etcd import EtcdElection
from metasrv.election._lease import LeaseOptions, Listener
from metasrv.election._protocol import Election
from metasrv.election._single import SingleLeader, SqliteFileLeader
from metasrv.election._sql import SqlElection

__all__ = [
    "Election",
    "EtcdElection",
    "LeaseOptions",
    "Listener",
    "SingleLeader",
    "SqlElection",
    "SqliteFileLeader",
    "advertised_addr",
    "build_election",
]
