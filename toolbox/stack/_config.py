"""Where the local stack lives and which ports it uses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

KAFKA_VERSION = "4.3.1"
"""Apache Kafka release the stack installs (from Maven Central)."""

_ENV_PREFIX = "METASRV_STACK_"

SASL_USERS: dict[str, str] = {"metasrv": "metasrv-secret"}
"""Users the SASL_SSL listener knows (for every mechanism), name -> password."""

S3_BUCKET = "metasrv-wal"
"""The bucket `stack up --s3` creates (DESIGN §6's default `[wal.archive] bucket`)."""
S3_ACCESS_KEY_ID = "metasrv"
"""The one identity the stack's S3 server accepts (AWS v2 and v4 signatures)."""
S3_SECRET_ACCESS_KEY = "metasrv-secret"


def _repo_root() -> Path:
    # Editable install: toolbox/stack/_config.py -> repo root holds pyproject.toml.
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else Path.cwd()


def default_state_dir() -> Path:
    """`METASRV_STACK_DIR`, else `.stack/` at the repository root."""
    env = os.environ.get(f"{_ENV_PREFIX}DIR")
    return Path(env).resolve() if env else _repo_root() / ".stack"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(f"{_ENV_PREFIX}{name}")
    return int(raw) if raw else default


def _env_ports(name: str, default: tuple[int, int, int]) -> tuple[int, int, int]:
    raw = os.environ.get(f"{_ENV_PREFIX}{name}")
    if not raw:
        return default
    ports = tuple(int(p) for p in raw.split(","))
    if len(ports) != 3:
        raise ValueError(f"{_ENV_PREFIX}{name} must list 3 ports, got {raw!r}")
    return ports[0], ports[1], ports[2]


@dataclass(frozen=True)
class StackConfig:
    """Settings of one local stack (state directory and ports)."""

    state_dir: Path = field(default_factory=default_state_dir)
    """Directory holding binaries, data, logs and pid files of every service."""
    host: str = "127.0.0.1"
    """Address every service listens on (loopback only)."""
    kafka_port: int = 19092
    """Kafka PLAINTEXT listener."""
    kafka_controller_port: int = 19093
    """Kafka KRaft CONTROLLER listener."""
    etcd_port: int = 12379
    """etcd client URL port."""
    etcd_peer_port: int = 12380
    """etcd peer URL port."""
    postgres_port: int = 15432
    """PostgreSQL TCP port."""
    kafka_ssl_port: int = 0
    """Kafka SSL listener (mutual TLS, certificates from `pki_dir`); 0: none."""
    kafka_sasl_ssl_port: int = 0
    """Kafka SASL_SSL listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 for `SASL_USERS`); 0: none."""
    etcd_tls: bool = False
    """etcd serves its client port over TLS and requires a client certificate."""
    s3_port: int = 19000
    """S3-compatible server (`stack up --s3`), plain HTTP."""
    spark_port: int = 17077
    """Spark standalone master RPC port (`stack up --spark`); the master's web UI is +1 and
    worker i uses +2+2i (RPC) and +3+2i (web UI)."""
    spark_workers: int = 2
    """Spark standalone workers started with the master."""
    spark_worker_cores: int = 1
    """Cores each worker offers."""
    spark_worker_memory: str = "1g"
    """Memory each worker offers its executors."""
    cluster_kafka_ports: tuple[int, int, int] = (19192, 19193, 19194)
    """PLAINTEXT listeners of the cluster's brokers 1, 2, 3 (`stack up --cluster`)."""
    cluster_controller_port: int = 19195
    """The cluster's dedicated KRaft controller (CONTROLLER listener)."""
    cluster_etcd_ports: tuple[int, int, int] = (12479, 12481, 12483)
    """Client ports of the cluster's etcd members 1, 2, 3; each member's peer port is +1."""
    kafka_version: str = KAFKA_VERSION
    """Apache Kafka release installed from Maven Central."""
    ready_timeout: float = 120.0
    """Seconds to wait for a started service to answer a real request."""
    foreign_wait: float = 30.0
    """Seconds to wait for a service we did not start, found on our port, to answer."""

    @property
    def pki_dir(self) -> Path:
        """Where the stack's throw-away CA and certificates live (`toolbox.stack.make_pki`)."""
        return self.state_dir / "pki"

    @property
    def cluster_dir(self) -> Path:
        """Where the production-shaped cluster (`stack up --cluster`) keeps its nodes."""
        return self.state_dir / "cluster"

    @classmethod
    def from_env(cls, **overrides: object) -> StackConfig:
        """Defaults, then `METASRV_STACK_*` environment variables, then non-None `overrides`."""
        cfg = cls(
            kafka_port=_env_int("KAFKA_PORT", cls.kafka_port),
            kafka_controller_port=_env_int("KAFKA_CONTROLLER_PORT", cls.kafka_controller_port),
            etcd_port=_env_int("ETCD_PORT", cls.etcd_port),
            etcd_peer_port=_env_int("ETCD_PEER_PORT", cls.etcd_peer_port),
            postgres_port=_env_int("POSTGRES_PORT", cls.postgres_port),
            s3_port=_env_int("S3_PORT", cls.s3_port),
            spark_port=_env_int("SPARK_PORT", cls.spark_port),
            spark_workers=_env_int("SPARK_WORKERS", cls.spark_workers),
            cluster_kafka_ports=_env_ports("CLUSTER_KAFKA_PORTS", cls.cluster_kafka_ports),
            cluster_controller_port=_env_int(
                "CLUSTER_CONTROLLER_PORT", cls.cluster_controller_port
            ),
            cluster_etcd_ports=_env_ports("CLUSTER_ETCD_PORTS", cls.cluster_etcd_ports),
            kafka_version=os.environ.get(f"{_ENV_PREFIX}KAFKA_VERSION") or cls.kafka_version,
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        if "state_dir" in given:
            given["state_dir"] = Path(str(given["state_dir"])).resolve()
        return replace(cfg, **given)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Endpoints:
    """How clients reach the running stack."""

    kafka_bootstrap: str
    """Kafka bootstrap servers, `host:port`."""
    etcd_endpoint: str
    """etcd client endpoint, `host:port`."""
    postgres_url: str
    """SQLAlchemy URL of the `metasrv` database."""
    spark_master: str | None = None
    """`spark://host:port` of the standalone Spark master, when the stack runs one."""
    s3: S3Endpoint | None = None
    """The S3-compatible server, when the stack runs one."""

    def env_lines(self) -> list[str]:
        """`NAME=value` lines a shell can eval."""
        lines = [
            f"KAFKA_BOOTSTRAP={self.kafka_bootstrap}",
            f"ETCD_ENDPOINT={self.etcd_endpoint}",
            f"POSTGRES_URL={self.postgres_url}",
        ]
        if self.spark_master:
            lines.append(f"SPARK_MASTER={self.spark_master}")
        if self.s3:
            lines.extend(self.s3.env_lines())
        return lines


@dataclass(frozen=True)
class S3Endpoint:
    """How clients reach the stack's S3-compatible server and its bucket."""

    endpoint: str
    """`http://host:port`."""
    bucket: str = S3_BUCKET
    access_key_id: str = S3_ACCESS_KEY_ID
    secret_access_key: str = S3_SECRET_ACCESS_KEY

    def env_lines(self) -> list[str]:
        """`NAME=value` lines a shell can eval."""
        return [
            f"S3_ENDPOINT={self.endpoint}",
            f"S3_BUCKET={self.bucket}",
            f"S3_ACCESS_KEY_ID={self.access_key_id}",
            f"S3_SECRET_ACCESS_KEY={self.secret_access_key}",
        ]


@dataclass(frozen=True)
class ClusterEndpoints:
    """How clients reach the production-shaped cluster and the shared PostgreSQL."""

    kafka_bootstrap: str
    """Every broker, `host:p1,host:p2,host:p3`."""
    etcd_endpoints: list[str]
    """Every etcd member's client endpoint, `host:port`."""
    postgres_url: str
    """SQLAlchemy URL of the single-node stack's `metasrv` database."""
    s3: S3Endpoint | None = None
    """The single-node stack's S3-compatible server, when asked for (`--cluster --s3`)."""

    def env_lines(self) -> list[str]:
        """`NAME=value` lines a shell can eval (`ETCD_ENDPOINT` is the first member)."""
        lines = [
            f"KAFKA_BOOTSTRAP={self.kafka_bootstrap}",
            f"ETCD_ENDPOINTS={','.join(self.etcd_endpoints)}",
            f"ETCD_ENDPOINT={self.etcd_endpoints[0]}",
            f"POSTGRES_URL={self.postgres_url}",
        ]
        if self.s3:
            lines.extend(self.s3.env_lines())
        return lines


def cluster_endpoints_of(cfg: StackConfig, *, s3: bool = False) -> ClusterEndpoints:
    """The cluster endpoints `cfg` describes (whether or not the services are up)."""
    return ClusterEndpoints(
        kafka_bootstrap=",".join(f"{cfg.host}:{p}" for p in cfg.cluster_kafka_ports),
        etcd_endpoints=[f"{cfg.host}:{p}" for p in cfg.cluster_etcd_ports],
        postgres_url=endpoints_of(cfg).postgres_url,
        s3=s3_endpoint_of(cfg) if s3 else None,
    )


def s3_endpoint_of(cfg: StackConfig) -> S3Endpoint:
    """The stack's S3-compatible server and bucket (whether or not it is up)."""
    return S3Endpoint(endpoint=f"http://{cfg.host}:{cfg.s3_port}")


def spark_master_url(cfg: StackConfig) -> str:
    """`spark://host:port` of the stack's standalone Spark master."""
    return f"spark://{cfg.host}:{cfg.spark_port}"


def endpoints_of(cfg: StackConfig, *, spark: bool = False, s3: bool = False) -> Endpoints:
    """The endpoints `cfg` describes (whether or not the services are up)."""
    return Endpoints(
        kafka_bootstrap=f"{cfg.host}:{cfg.kafka_port}",
        etcd_endpoint=f"{cfg.host}:{cfg.etcd_port}",
        postgres_url=(
            f"postgresql+psycopg://metasrv:metasrv@{cfg.host}:{cfg.postgres_port}/metasrv"
        ),
        spark_master=spark_master_url(cfg) if spark else None,
        s3=s3_endpoint_of(cfg) if s3 else None,
    )
