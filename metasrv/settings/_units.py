"""Parsing of human durations ("30m", "500ms") and sizes ("512MB") used in configuration."""

from __future__ import annotations

import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|s|m|h|d)")
_DURATION_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_FACTOR = {
    "b": 1,
    "kb": 1024,
    "mb": 1024**2,
    "gb": 1024**3,
    "tb": 1024**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_duration(value: str | int | float) -> float:
    """Return seconds for "1h30m", "500ms", "0s" or a bare number of seconds."""
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative: {value}")
        return float(value)
    text = value.strip().lower()
    if not text:
        raise ValueError("empty duration")
    pos = 0
    total = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise ValueError(f"invalid duration {value!r}: use e.g. '30s', '500ms', '1h30m'")
    return total


def parse_size(value: str | int) -> int:
    """Return bytes for "512MB", "16MiB", "1024" (GreptimeDB reads MB as MiB; so do we)."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"invalid size {value!r}: use e.g. '512MB', '16MiB', '1024'")
    unit = (match.group(2) or "b").lower()
    return int(float(match.group(1)) * _SIZE_FACTOR[unit])
