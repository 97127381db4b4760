"""Where the region stat history lives: `[history] stats_url`, one directory per cluster.

Every leader of a cluster writes to the same place, and the reconcile job reads it from
there, so the location must not depend on which process (or working directory) asks:

    {stats_url}/cluster={slug(kv key prefix)}/stats/hour=YYYYMMDDHH/writer={slug(node)}/...
    {stats_url}/cluster={slug(kv key prefix)}/snapshots/hour=YYYYMMDDHH/writer={slug(node)}/...

`stats_url` is an absolute path (local, or a shared mount such as NFS or a Kubernetes
volume) or a URL pyarrow and Spark both read (`s3://bucket/prefix`, `hdfs://nn/path`;
Spark reads `s3://` as `s3a://`). A relative path is refused by the settings. Left
empty it defaults to a path that follows the cluster's identity:

- SQL kv on a SQLite file: `metasrv-stat-history/` beside that file (the file *is* the
  cluster, so two embedded clusters in two directories never share a history);
- otherwise `$XDG_STATE_HOME/metasrv/stat-history` (`~/.local/state/...`): one place per
  host, clusters kept apart by their kv key prefix.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from metasrv.settings import is_url
from metasrv.sql import sqlite_file

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from metasrv.settings import Settings

CLUSTER = "cluster"
"""Directory key naming the cluster (its kv key prefix, slugged)."""
WRITER = "writer"
"""Hive partition column naming the metasrv node that wrote a file."""
DEFAULT_DIR_NAME = "metasrv-stat-history"
"""Directory name of the default history beside a SQLite kv file."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def path_slug(text: str) -> str:
    """A path- and Hive-safe name for `text`: its safe characters plus a short hash.

    The hash keeps distinct texts apart after the unsafe characters are replaced
    (`a/b` and `a_b`), and a path segment never holds `/`, `:` or `=`.
    """
    safe = _UNSAFE.sub("_", text).strip("._")[:48] or "_"
    return f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _xdg_state_home() -> Path:
    given = os.environ.get("XDG_STATE_HOME")
    return Path(given) if given else Path.home() / ".local" / "state"


def stats_base(settings: Settings) -> str:
    """`[history] stats_url`, or the default described in the module docstring."""
    if settings.history.stats_url:
        return settings.history.stats_url.rstrip("/")
    if settings.kv.backend == "sql":
        kv_file = sqlite_file(settings.kv.sql_url)
        if kv_file is not None:
            return str(kv_file.parent / DEFAULT_DIR_NAME)
    return str(_xdg_state_home() / "metasrv" / "stat-history")


def cluster_root(settings: Settings, base: str | None = None) -> str:
    """The history directory of this cluster: `{base}/cluster={slug(key prefix)}`.

    `base` overrides `stats_base(settings)` (the CLI's `--history`).
    """
    root = (base or stats_base(settings)).rstrip("/")
    return f"{root}/{CLUSTER}={path_slug(settings.kv.key_prefix)}"


def writer_partition(node: str) -> str:
    """The `writer=...` path segment of a metasrv node."""
    return f"{WRITER}={path_slug(node)}"


def open_location(location: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem and in-filesystem path of a history path or URL."""
    # Imported here: settings validation imports this module, and must not pay for pyarrow.
    import pyarrow.fs as pafs

    if location.startswith("s3a://"):
        location = "s3://" + location.removeprefix("s3a://")
    if not is_url(location):
        return pafs.LocalFileSystem(), location
    fs, path = pafs.FileSystem.from_uri(location)
    return fs, path


def spark_location(location: str) -> str:
    """The same location as Spark (Hadoop) names it: `s3://` is read through `s3a://`,
    and a plain path is `file://`, so a cluster whose default filesystem is HDFS still
    reads the (shared) local mount."""
    if location.startswith("s3://"):
        return "s3a://" + location.removeprefix("s3://")
    if not is_url(location):
        return f"file://{location}"
    return location


def location_exists(location: str) -> bool:
    """True when the directory exists; True as well when pyarrow cannot tell (Spark may)."""
    import pyarrow.fs as pafs

    try:
        fs, path = open_location(location)
        found = fs.get_file_info(path).type
    except (OSError, ValueError, ImportError):
        # A filesystem pyarrow has no driver for here (hdfs without libhdfs): let Spark try.
        return True
    return bool(found != pafs.FileType.NotFound)
