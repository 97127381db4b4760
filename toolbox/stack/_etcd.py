"""etcd (Debian's etcd-server), one member."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import pyetcd

from metasrv.errors import ServiceError
from toolbox.stack._certs import make_pki
from toolbox.stack._process import spawn
from toolbox.stack._service import Service

# etcd 3.4 refuses to start on architectures it does not officially support unless
# ETCD_UNSUPPORTED_ARCH names the (Go) architecture.
_SUPPORTED_ARCHES = {"x86_64", "amd64", "aarch64", "arm64", "ppc64le"}
_GO_ARCH = {"armv7l": "arm", "armv6l": "arm", "i686": "386", "i386": "386"}

# pyetcd raises its own exceptions for protocol errors but lets grpc's through for
# connection trouble; both mean "not healthy" here.
_PROBE_ERRORS: tuple[type[BaseException], ...] = (Exception,)


def require_etcd() -> None:
    """Raise `ServiceError` when Debian's etcd is not installed."""
    if shutil.which("etcd") is None:
        raise ServiceError(
            "etcd is not installed; run `deploy/bootstrap.sh` (or `make stack`)",
            details={"service": "etcd"},
        )


def etcd_env() -> dict[str, str]:
    """The environment etcd runs in (names the architecture where etcd needs it)."""
    env = dict(os.environ)
    machine = platform.machine()
    if machine not in _SUPPORTED_ARCHES:
        env["ETCD_UNSUPPORTED_ARCH"] = _GO_ARCH.get(machine, machine)
    return env


class Etcd(Service):
    """A single-member etcd cluster on 127.0.0.1."""

    name = "etcd"
    stop_grace = 15.0

    @property
    def port(self) -> int:
        return self.cfg.etcd_port

    @property
    def endpoint(self) -> str:
        return f"{self.cfg.host}:{self.cfg.etcd_port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "etcd.log"

    @property
    def data(self) -> Path:
        return self.dir / "data"

    def install(self) -> None:
        require_etcd()
        self.dir.mkdir(parents=True, exist_ok=True)

    def launch(self) -> None:
        c = self.cfg
        scheme = "https" if c.etcd_tls else "http"
        client = f"{scheme}://{c.host}:{c.etcd_port}"
        peer = f"http://{c.host}:{c.etcd_peer_port}"
        argv = [
            "etcd",
            "--name",
            "metasrv",
            "--data-dir",
            str(self.data),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"metasrv={peer}",
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            "metasrv-stack",
            "--logger",
            "zap",
            "--log-level",
            "warn",
            # Keep the data dir small across many test runs.
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "10000",
            *self._tls_args(),
        ]
        spawn(argv, log_file=self.log_file, pid_file=self.pid_file, cwd=self.dir, env=etcd_env())

    def _tls_args(self) -> list[str]:
        if not self.cfg.etcd_tls:
            return []
        pki = make_pki(self.cfg.pki_dir)
        return [
            "--cert-file",
            str(pki.server_cert),
            "--key-file",
            str(pki.server_key),
            "--trusted-ca-file",
            str(pki.ca_cert),
            "--client-cert-auth",
        ]

    def healthy(self, timeout: float = 5.0) -> bool:
        tls: dict[str, str] = {}
        if self.cfg.etcd_tls:
            pki = make_pki(self.cfg.pki_dir)
            tls = {
                "ca_cert": str(pki.ca_cert),
                "cert_cert": str(pki.client_cert),
                "cert_key": str(pki.client_key),
            }
        client = pyetcd.client(self.cfg.host, self.cfg.etcd_port, timeout=timeout, **tls)
        try:
            client.get("/metasrv-stack-probe")
            return True
        except _PROBE_ERRORS:
            return False
        finally:
            client.close()
