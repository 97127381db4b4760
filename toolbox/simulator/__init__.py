"""Simulated datanodes: real WAL writes to Kafka, memtables, SST flushes, heartbeats, replay.

Used by `metasrv demo`, the tests and the benchmarks. The core is CLI-free;
`python -m toolbox.simulator` runs a datanode as its own OS process (for SIGKILL tests).
"""

from toolbox.simulator._datanode import HeartbeatOutcome, Rejection, SimDatanode
from toolbox.simulator._harness import (
    ArchiverProcess,
    MetasrvProcess,
    free_port,
    log_records,
    metasrv_argv,
    migrate,
    render_config,
)
from toolbox.simulator._region import (
    RecoveryReport,
    RegionKilled,
    RegionReport,
    SimRegion,
    VerifyReport,
)
from toolbox.simulator._storage import Manifest, RegionStore, WalRow, digest
from toolbox.simulator._wal import Tee, TopicCounters, WalWriter, read_region_entries, region_key
from toolbox.simulator._workload import (
    NodeRecovery,
    RegionKind,
    RegionPlan,
    Workload,
    WorkloadConfig,
    drive_writes,
    plan_regions,
)

__all__ = [
    "ArchiverProcess",
    "HeartbeatOutcome",
    "Manifest",
    "MetasrvProcess",
    "NodeRecovery",
    "RecoveryReport",
    "RegionKilled",
    "RegionKind",
    "RegionPlan",
    "RegionReport",
    "RegionStore",
    "Rejection",
    "SimDatanode",
    "SimRegion",
    "Tee",
    "TopicCounters",
    "VerifyReport",
    "WalRow",
    "WalWriter",
    "Workload",
    "WorkloadConfig",
    "digest",
    "drive_writes",
    "free_port",
    "log_records",
    "metasrv_argv",
    "migrate",
    "plan_regions",
    "read_region_entries",
    "region_key",
    "render_config",
]
