"""Region stat snapshots written as Parquet for the reconcile job, and where they live."""

from metasrv.stat_history._location import (
    WRITER,
    cluster_root,
    location_exists,
    open_location,
    path_slug,
    spark_location,
    writer_partition,
)
from metasrv.stat_history._writer import (
    PARTITION,
    SNAPSHOTS_DIR,
    SNAPSHOTS_SCHEMA,
    STATS_DIR,
    STATS_SCHEMA,
    StatHistoryWriter,
    hour_partition,
)

__all__ = [
    "PARTITION",
    "SNAPSHOTS_DIR",
    "SNAPSHOTS_SCHEMA",
    "STATS_DIR",
    "STATS_SCHEMA",
    "WRITER",
    "StatHistoryWriter",
    "cluster_root",
    "hour_partition",
    "location_exists",
    "open_location",
    "path_slug",
    "spark_location",
    "writer_partition",
]
