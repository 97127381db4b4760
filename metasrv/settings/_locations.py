"""Validation of location settings (a path or a URL)."""

from __future__ import annotations

import re
from pathlib import Path


def is_url(location: str) -> bool:
    """True for `scheme://...` (s3, hdfs, file, ...), False for a plain path."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", location) is not None


def check_stats_url(value: str) -> str:
    """Validate `[history] stats_url`: empty, an absolute path, or a URL."""
    if value == "" or is_url(value) or Path(value).is_absolute():
        return value
    raise ValueError(
        f"stats_url {value!r} is relative; give an absolute path or a URL (s3://, hdfs://): "
        "a relative path would resolve against each process's working directory"
    )
