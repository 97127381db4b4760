"""The local real services (Kafka, etcd, PostgreSQL, a standalone Spark cluster, an
S3-compatible object store) for development, tests and the demo.

Two shapes: the single-node stack (`ensure_up`: one combined KRaft broker, one etcd member,
PostgreSQL), the default for quick tests; and the production-shaped cluster (`cluster_up`:
a KRaft controller and three brokers at replication factor 3, `min.insync.replicas` 2, and
a 3-member etcd) for tests and demos that take single brokers and members down.
"""

from toolbox.stack._certs import Pki, make_pki
from toolbox.stack._cluster import Cluster, cluster_running, cluster_up
from toolbox.stack._config import (
    KAFKA_VERSION,
    S3_ACCESS_KEY_ID,
    S3_BUCKET,
    S3_SECRET_ACCESS_KEY,
    SASL_USERS,
    ClusterEndpoints,
    Endpoints,
    S3Endpoint,
    StackConfig,
    cluster_endpoints_of,
    endpoints_of,
    s3_endpoint_of,
    spark_master_url,
)
from toolbox.stack._process import pid_alive, port_open, process_stopped
from toolbox.stack._s3 import S3PROXY_VERSION, download_verified, s3_client
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
    "S3PROXY_VERSION",
    "S3_ACCESS_KEY_ID",
    "S3_BUCKET",
    "S3_SECRET_ACCESS_KEY",
    "SASL_USERS",
    "SERVICE_NAMES",
    "Cluster",
    "ClusterEndpoints",
    "Endpoints",
    "Pki",
    "S3Endpoint",
    "ServiceStatus",
    "StackConfig",
    "cluster_endpoints_of",
    "cluster_running",
    "cluster_up",
    "down",
    "download_verified",
    "endpoints_of",
    "ensure_up",
    "make_pki",
    "pid_alive",
    "port_open",
    "process_stopped",
    "s3_client",
    "s3_endpoint_of",
    "service_pid",
    "spark_master_status",
    "spark_master_url",
    "spark_up",
    "start_service",
    "status",
    "stop_service",
]
