"""The local real services (Kafka, etcd, PostgreSQL, a standalone Spark cluster) for
development, tests and the demo."""

from toolbox.stack._config import (
    KAFKA_VERSION,
    Endpoints,
    StackConfig,
    endpoints_of,
    spark_master_url,
)
from toolbox.stack._spark import master_status as spark_master_status
from toolbox.stack._stack import (
    SERVICE_NAMES,
    ServiceStatus,
    down,
    ensure_up,
    service_pid,
    spark_up,
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
    "spark_master_status",
    "spark_master_url",
    "spark_up",
    "start_service",
    "status",
    "stop_service",
]
