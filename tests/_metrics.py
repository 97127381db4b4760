"""Read a metric as Prometheus reads it: by the sample name and labels `/metrics` exports,
through `prometheus_client`'s public registry API (never a metric object's internals)."""

from __future__ import annotations

from collections.abc import Mapping

from metasrv.metrics import Metrics

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}
_ABSENT_IS_ZERO = {"counter", "histogram"}
"""Kinds whose labelled series start at zero, so one never touched reads 0 (a gauge has no
value until it is set)."""


def sample(metrics: Metrics, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The value of the sample `name` (`metasrv_heartbeats_received_total`,
    `metasrv_procedure_duration_seconds_sum`, ...) with exactly these labels.

    A counter's or histogram's series that was never touched reads 0.0; a name no metric of
    `metrics` exports, or a gauge series never set, raises LookupError.
    """
    registry = metrics.registry
    value = registry.get_sample_value(name, dict(labels or {}))
    if value is not None:
        return value
    for family in registry.collect():
        suffixes = _SUFFIXES.get(family.type, ("",))
        if any(name == family.name + suffix for suffix in suffixes):
            if family.type in _ABSENT_IS_ZERO:
                return 0.0
            raise LookupError(f"{name} has no series with labels {dict(labels or {})}")
    raise LookupError(f"no metric exports a sample named {name}")
