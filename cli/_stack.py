"""`metasrv stack up|down|status`: the local real services (`toolbox.stack`, loaded lazily)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli._options import shared_options
from metasrv.errors import MetasrvError

if TYPE_CHECKING:
    from toolbox.stack import ServiceStatus, StackConfig

stack_app = typer.Typer(
    help="Local Kafka, etcd, PostgreSQL (and Spark, S3) for development and tests.",
    no_args_is_help=True,
)

StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="State directory (default: .stack/ at the repo root)."),
]
KafkaPort = Annotated[int | None, typer.Option(help="Kafka port (env METASRV_STACK_KAFKA_PORT).")]
EtcdPort = Annotated[
    int | None, typer.Option(help="etcd client port (env METASRV_STACK_ETCD_PORT).")
]
PostgresPort = Annotated[
    int | None, typer.Option(help="PostgreSQL port (env METASRV_STACK_POSTGRES_PORT).")
]
Spark = Annotated[
    bool,
    typer.Option(
        "--spark",
        help="Also a standalone Spark master and workers (ports from env "
        "METASRV_STACK_SPARK_PORT, default 17077 and up).",
    ),
]
S3 = Annotated[
    bool,
    typer.Option(
        "--s3",
        help="Also an S3-compatible object store (S3Proxy, filesystem backend) with its "
        "bucket (port from env METASRV_STACK_S3_PORT, default 19000).",
    ),
]

ClusterFlag = Annotated[
    bool,
    typer.Option(
        "--cluster",
        help="The production-shaped cluster instead of the single-node Kafka and etcd: a KRaft "
        "controller and 3 brokers (replication factor 3, min.insync.replicas 2) and a "
        "3-member etcd, beside the stack's PostgreSQL. Ports from env "
        "METASRV_STACK_CLUSTER_KAFKA_PORTS (default 19192,19193,19194), "
        "METASRV_STACK_CLUSTER_CONTROLLER_PORT (19195), METASRV_STACK_CLUSTER_ETCD_PORTS "
        "(12479,12481,12483; each peer port is the client port + 1).",
    ),
]


def _config(
    state_dir: Path | None, kafka_port: int | None, etcd_port: int | None, postgres_port: int | None
) -> StackConfig:
    from toolbox.stack import StackConfig

    cfg = StackConfig.from_env(
        state_dir=state_dir, kafka_port=kafka_port, etcd_port=etcd_port, postgres_port=postgres_port
    )
    # A port moved on the command line takes its companion listener along (port + 1).
    return StackConfig.from_env(
        state_dir=cfg.state_dir,
        kafka_port=cfg.kafka_port,
        etcd_port=cfg.etcd_port,
        postgres_port=cfg.postgres_port,
        kafka_controller_port=None if kafka_port is None else kafka_port + 1,
        etcd_peer_port=None if etcd_port is None else etcd_port + 1,
    )


stack_options = shared_options(
    (
        ("state_dir", StateDir),
        ("kafka_port", KafkaPort),
        ("etcd_port", EtcdPort),
        ("postgres_port", PostgresPort),
    ),
    into="cfg",
    build=lambda **ports: contextlib.nullcontext(_config(**ports)),
)
"""Give a stack command the state dir and port options; it gets `cfg: StackConfig`."""


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")


def _print_origins(statuses: list[ServiceStatus]) -> None:
    for st in statuses:
        origin = f"pid {st.pid}" if st.pid is not None else "reused, not started here"
        typer.echo(f"# {st.name:<16} {st.endpoint:<24} {origin}", err=True)


@stack_app.command("up")
@stack_options
def up_cmd(
    spark: Spark = False, s3: S3 = False, cluster: ClusterFlag = False, *, cfg: StackConfig
) -> None:
    """Install (first time) and start every service; print the endpoints. Idempotent."""
    from toolbox.stack import cluster_endpoints_of, cluster_up, ensure_up, start_service, status

    _setup_logging()
    if cluster:
        try:
            # PostgreSQL and the object store are the single-node stack's, shared.
            shared = [start_service(cfg, name) for name in ("postgres", *(["s3"] if s3 else []))]
            running = cluster_up(cfg)
        except MetasrvError as exc:
            typer.echo(f"stack up --cluster failed: {exc.message}", err=True)
            raise typer.Exit(1) from exc
        _print_origins([*shared, *running.status()])
        for line in cluster_endpoints_of(cfg, s3=s3).env_lines():
            typer.echo(line)
        return
    try:
        endpoints = ensure_up(cfg, spark=spark, s3=s3)
    except MetasrvError as exc:
        typer.echo(f"stack up failed: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    _print_origins(status(cfg, spark=spark, s3=s3))
    for line in endpoints.env_lines():
        typer.echo(line)


@stack_app.command("status")
@stack_options
def status_cmd(
    spark: Spark = False, s3: S3 = False, cluster: ClusterFlag = False, *, cfg: StackConfig
) -> None:
    """Per service: running (pid of ours), healthy (a real request), endpoint."""
    from toolbox.stack import Cluster, cluster_endpoints_of, endpoints_of, status

    if cluster:
        shared = [st for st in status(cfg, s3=s3) if st.name in ("postgres", "s3")]
        results = [*shared, *Cluster(cfg).status()]
        lines = cluster_endpoints_of(cfg, s3=s3).env_lines()
    else:
        results = status(cfg, spark=spark, s3=s3)
        lines = endpoints_of(cfg, spark=spark, s3=s3).env_lines()
    for st in results:
        running = (
            f"running (pid {st.pid})"
            if st.pid is not None
            else ("running (not started here)" if st.healthy else "not running")
        )
        health = "healthy" if st.healthy else "UNHEALTHY"
        typer.echo(f"{st.name:<16} {st.endpoint:<24} {running:<28} {health}")
    for line in lines:
        typer.echo(line)
    if not all(st.healthy for st in results):
        raise typer.Exit(1)


@stack_app.command("down")
@stack_options
def down_cmd(*, cfg: StackConfig) -> None:
    """Stop the services this state dir started (its cluster's too; never ones it merely
    reused)."""
    from toolbox.stack import Cluster, cluster_running, down

    _setup_logging()
    try:
        stopped = Cluster(cfg).down() if cluster_running(cfg) else []
        stopped += down(cfg)
    except MetasrvError as exc:
        typer.echo(f"stack down failed: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


def register(app: typer.Typer) -> None:
    """Add `stack` to the root app."""
    app.add_typer(stack_app, name="stack")
