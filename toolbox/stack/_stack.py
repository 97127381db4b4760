"""Bring the whole local stack up, report on it, take it down."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from metasrv.errors import InvalidArgument, ServiceError
from toolbox.stack._config import Endpoints, StackConfig, endpoints_of, spark_master_url
from toolbox.stack._etcd import Etcd
from toolbox.stack._kafka import Kafka
from toolbox.stack._postgres import Postgres
from toolbox.stack._process import dir_lock, wait_until
from toolbox.stack._s3 import S3Proxy
from toolbox.stack._service import Service
from toolbox.stack._spark import spark_services

logger = logging.getLogger(__name__)

ServiceName = Literal["kafka", "etcd", "postgres"]
SERVICE_NAMES: tuple[ServiceName, ...] = ("kafka", "etcd", "postgres")
_CLASSES: dict[str, type[Service]] = {
    "kafka": Kafka,
    "etcd": Etcd,
    "postgres": Postgres,
    "s3": S3Proxy,
}


def service(cfg: StackConfig, name: str) -> Service:
    """The service object called `name` ("kafka", "etcd", "postgres", "s3", "spark-master"
    or "spark-worker-N")."""
    if name in _CLASSES:
        return _CLASSES[name](cfg)
    for svc in spark_services(cfg):
        if svc.name == name:
            return svc
    known = [*_CLASSES, *(svc.name for svc in spark_services(cfg))]
    raise InvalidArgument(f"unknown service {name!r}; expected one of {', '.join(known)}")


@dataclass(frozen=True)
class ServiceStatus:
    """What `status` found for one service."""

    name: str
    endpoint: str
    """`host:port` clients use."""
    pid: int | None
    """Pid of the process this state dir started, None when it runs none."""
    healthy: bool
    """The endpoint answered a real request."""

    @property
    def external(self) -> bool:
        """Healthy but served by a process another state dir (or someone else) started."""
        return self.healthy and self.pid is None


@contextmanager
def _state_lock(cfg: StackConfig) -> Iterator[None]:
    # Several test sessions may call ensure_up at once; one at a time starts services.
    with dir_lock(cfg.state_dir):
        yield


def _start(svc: Service) -> ServiceStatus:
    cfg = svc.cfg
    pid = svc.pid()
    if pid is not None:
        # Ours; it may have been launched a moment ago and not answer yet.
        if not svc.healthy():
            logger.info("%s is running (pid %d) but not answering yet; waiting", svc.name, pid)
            wait_until(
                svc.name,
                svc.healthy,
                timeout=cfg.ready_timeout,
                log_file=svc.log_file,
                alive=svc.process_alive,
            )
        return ServiceStatus(svc.name, svc.endpoint, svc.pid(), True)
    if svc.listening():
        # Someone else's (another checkout's stack, or one still starting): reuse it if it
        # answers like the service should, within `foreign_wait`.
        try:
            wait_until(
                svc.name,
                lambda: svc.healthy(timeout=min(5.0, cfg.foreign_wait)),
                timeout=cfg.foreign_wait,
                log_file=svc.log_file,
            )
        except ServiceError:
            raise ServiceError(
                f"{svc.name}: port {svc.port} is taken by something that does not answer "
                f"like {svc.name}",
                details={"service": svc.name, "endpoint": svc.endpoint},
            ) from None
        logger.info("%s: reusing the healthy service already on %s", svc.name, svc.endpoint)
        return ServiceStatus(svc.name, svc.endpoint, None, True)
    svc.install()
    svc.start()
    return ServiceStatus(svc.name, svc.endpoint, svc.pid(), True)


def _ready(svc: Service) -> ServiceStatus:
    """`_start`, then what a started service still needs to be usable (the S3 bucket)."""
    started = _start(svc)
    if isinstance(svc, S3Proxy):
        svc.ensure_bucket()
    return started


def start_service(cfg: StackConfig, name: str) -> ServiceStatus:
    """Install if needed and start one service; reuse a healthy one already on its port.

    Idempotent. Raises `ServiceError` (with the log tail) when it cannot be made healthy.
    """
    svc = service(cfg, name)
    with _state_lock(cfg):
        return _ready(svc)


def stop_service(cfg: StackConfig, name: str) -> bool:
    """Stop one service this state dir started (SIGTERM, then SIGKILL); False if none ran."""
    svc = service(cfg, name)
    with _state_lock(cfg):
        return svc.stop()


def service_pid(cfg: StackConfig, name: str) -> int | None:
    """Pid of the named service this state dir started (for fault tests that signal it)."""
    return service(cfg, name).pid()


def _services(cfg: StackConfig, spark: bool, s3: bool = False) -> list[Service]:
    base = [service(cfg, name) for name in SERVICE_NAMES]
    if s3:
        base.append(S3Proxy(cfg))
    return base + spark_services(cfg) if spark else base


def ensure_up(
    cfg: StackConfig | None = None, *, spark: bool = False, s3: bool = False
) -> Endpoints:
    """Make Kafka, etcd and PostgreSQL (with `spark`, also a standalone Spark master and
    its workers; with `s3`, an S3-compatible server and its bucket) healthy, starting what
    is missing; return the endpoints."""
    cfg = cfg or StackConfig.from_env()
    with _state_lock(cfg):
        for svc in _services(cfg, spark, s3):
            _ready(svc)
    return endpoints_of(cfg, spark=spark, s3=s3)


def spark_up(cfg: StackConfig) -> str:
    """Only the standalone Spark master and workers (a state dir of their own, e.g. for a
    benchmark's bigger workers); returns the master URL. `down(cfg)` stops them."""
    with _state_lock(cfg):
        for svc in spark_services(cfg):
            _start(svc)
    return spark_master_url(cfg)


def status(
    cfg: StackConfig | None = None, *, spark: bool = False, s3: bool = False
) -> list[ServiceStatus]:
    """Each service's pid (if ours) and health (a real request)."""
    cfg = cfg or StackConfig.from_env()
    out = []
    for svc in _services(cfg, spark, s3):
        healthy = svc.listening() and svc.healthy()
        out.append(ServiceStatus(svc.name, svc.endpoint, svc.pid(), healthy))
    return out


def down(cfg: StackConfig | None = None) -> list[str]:
    """Stop every service this state dir started (Spark's and S3's too); returns the names
    stopped."""
    cfg = cfg or StackConfig.from_env()
    # Reverse start order (workers before their master); an error on one still lets the
    # others stop.
    stopped: list[str] = []
    errors: list[ServiceError] = []
    with _state_lock(cfg):
        for svc in reversed(_services(cfg, spark=True, s3=True)):
            try:
                if svc.stop():
                    stopped.append(svc.name)
            except ServiceError as exc:
                errors.append(exc)
    if errors:
        raise errors[0]
    return stopped
