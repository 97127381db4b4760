"""PostgreSQL (Debian's server binaries), one cluster owned by the `postgres` OS user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import psycopg

from metasrv.errors import ServiceError
from toolbox.stack._process import run, service_error
from toolbox.stack._service import Service

_PG_BIN_CANDIDATES = (
    "/usr/lib/postgresql/17/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/15/bin",
)
_ROLE = "metasrv"


def _pg_bin() -> Path:
    for candidate in _PG_BIN_CANDIDATES:
        if (Path(candidate) / "initdb").is_file():
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ServiceError(
        "PostgreSQL server binaries not found; run `deploy/bootstrap.sh` (or `make stack`)",
        details={"service": "postgres"},
    )


class Postgres(Service):
    """A PostgreSQL cluster in the state dir, TCP on 127.0.0.1 only, socket in the state dir."""

    name = "postgres"

    @property
    def port(self) -> int:
        return self.cfg.postgres_port

    @property
    def endpoint(self) -> str:
        return f"{self.cfg.host}:{self.cfg.postgres_port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "postgres.log"

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.dir / "run"

    def _as_owner(self, argv: list[str]) -> list[str]:
        # initdb and postgres refuse to run as root: run them as the `postgres` OS user.
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _make_traversable(self) -> None:
        # The postgres user must reach the data dir through every parent directory.
        for parent in self.dir.parents:
            mode = parent.stat().st_mode
            if not mode & 0o001:
                os.chmod(parent, mode | 0o001)

    def install(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._make_traversable()
        self._chown(self.dir)
        self.socket_dir.mkdir(exist_ok=True)
        self._chown(self.socket_dir)
        self.log_file.touch()
        self._chown(self.log_file)
        if (self.data / "PG_VERSION").exists():
            return
        if self.data.exists():
            shutil.rmtree(self.data)
        run(
            self._as_owner(
                [
                    str(_pg_bin() / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                ]
            ),
            what="postgres initdb",
            log_file=self.log_file,
            timeout=300,
        )

    def pid(self) -> int | None:
        # pg_ctl keeps the postmaster's pid as the first line of postmaster.pid.
        try:
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if str(self.data).encode() in cmdline else None

    def process_alive(self) -> bool:
        # pg_ctl -w returns once the postmaster runs, so the checked pid is reliable here.
        return self.pid() is not None

    def launch(self) -> None:
        self._make_traversable()
        options = (
            f"-c listen_addresses={self.cfg.host} -p {self.cfg.postgres_port} "
            f"-c unix_socket_directories={self.socket_dir} "
            "-c max_connections=200 -c shared_buffers=64MB -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
        run(
            self._as_owner(
                [
                    str(_pg_bin() / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log_file),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "120",
                    "start",
                ]
            ),
            what="postgres start",
            log_file=self.dir / "pg_ctl.log",
            timeout=180,
        )
        self._bootstrap_role()

    def _bootstrap_role(self) -> None:
        # Over the unix socket as `postgres` (local trust) create the login role and DB.
        try:
            with psycopg.connect(
                host=str(self.socket_dir),
                port=self.cfg.postgres_port,
                user="postgres",
                dbname="postgres",
                autocommit=True,
                connect_timeout=10,
            ) as conn:
                role = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (_ROLE,))
                if role.fetchone() is None:
                    conn.execute(f"CREATE ROLE {_ROLE} LOGIN SUPERUSER PASSWORD '{_ROLE}'")
                db = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (_ROLE,))
                if db.fetchone() is None:
                    conn.execute(f"CREATE DATABASE {_ROLE} OWNER {_ROLE}")
        except psycopg.Error as exc:
            raise service_error(
                "postgres", f"bootstrap of role/db failed ({exc})", self.log_file
            ) from exc

    def healthy(self, timeout: float = 5.0) -> bool:
        try:
            with psycopg.connect(
                host=self.cfg.host,
                port=self.cfg.postgres_port,
                user=_ROLE,
                password=_ROLE,
                dbname=_ROLE,
                connect_timeout=max(1, int(timeout)),
            ) as conn:
                row = conn.execute("SELECT 1").fetchone()
                return row is not None and row[0] == 1
        except psycopg.Error:
            return False

    def stop(self) -> bool:
        if self.pid() is None:
            return False
        result = subprocess.run(
            self._as_owner(
                [
                    str(_pg_bin() / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    "60",
                    "stop",
                ]
            ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            timeout=90,
        )
        if result.returncode != 0 and self.pid() is not None:
            raise service_error("postgres", "pg_ctl stop failed", self.log_file)
        return True
