"""The local real services (Kafka, etcd, PostgreSQL) for development, tests and the demo."""

from metasrv.stack._config import KAFKA_VERSION, Endpoints, StackConfig, endpoints_of
from metasrv.stack._stack import (
    SERVICE_NAMES,
    ServiceStatus,
    down,
    ensure_up,
    service_pid,
    start_service,
    status,
    stop_service,
)

__all__ = [
    "KAFKA_VERSION",
    "SERVICE_NAMES",
    "Endpoints",
    "ServiceStatus",
    "StackConfig",
    "down",
    "endpoints_of",
    "ensure_up",
    "service_pid",
    "start_service",
    "status",
    "stop_service",
]
