"""A Spark standalone cluster (one master, N workers) from the PySpark installation's jars.

No Spark download: PySpark ships every jar the standalone daemons need, so the master and
workers are its own launch classes (`org.apache.spark.deploy.master.Master`,
`org.apache.spark.deploy.worker.Worker`) run with `java -cp pyspark/jars/*`. Ports, logs,
pid files and the workers' scratch space live under the stack's state directory:

    spark-master/     master.log, pid           port P (RPC), P+1 (web UI, JSON status)
    spark-worker-i/   worker.log, pid, work/    ports P+2+2i (RPC), P+3+2i (web UI)

Workers are small on purpose (`spark_worker_cores`, `spark_worker_memory`): the stack runs
on a developer's machine beside Kafka, etcd and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from metasrv.errors import ServiceError
from toolbox.stack._config import StackConfig, spark_master_url
from toolbox.stack._process import spawn
from toolbox.stack._service import Service


def pyspark_home() -> Path:
    """The PySpark package directory (holds `jars/`); it doubles as SPARK_HOME."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def scala_version() -> str:
    """The Scala binary version PySpark's jars are built for (from `spark-core_X.Y-*.jar`)."""
    for jar in (pyspark_home() / "jars").glob("spark-core_*.jar"):
        return jar.name.removeprefix("spark-core_").split("-", 1)[0]
    raise ServiceError(f"no spark-core jar under {pyspark_home() / 'jars'}")


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    return str(Path(java_home) / "bin" / "java") if java_home else "java"


def master_status(cfg: StackConfig, timeout: float = 5.0) -> dict[str, Any] | None:
    """The master's JSON status page (`/json/`), or None when it does not answer."""
    url = f"http://{cfg.host}:{cfg.spark_port + 1}/json/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
    except (OSError, urllib.error.URLError, ValueError):
        return None


class _SparkDaemon(Service):
    """What the master and the workers share: the JVM command line and environment."""

    stop_grace = 15.0

    def _argv(self, main: str, heap: str, *args: str, props: tuple[str, ...] = ()) -> list[str]:
        home = pyspark_home()
        return [
            _java(),
            f"-Xmx{heap}",
            "-Djava.awt.headless=true",
            # A taken port is an error naming it, not a silent move to the next one (which
            # the health probe and the printed endpoints would never find).
            "-Dspark.port.maxRetries=0",
            *props,
            # Names the state dir on the command line, so `pid()` recognises the process.
            f"-Dtoolbox.stack.dir={self.dir}",
            "-cp",
            f"{home / 'jars'}/*",
            main,
            *args,
        ]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SPARK_HOME"] = str(pyspark_home())
        # The worker builds each executor's class path from SPARK_HOME/jars, but first asks
        # for the Scala version, which it otherwise looks for in a source checkout's build
        # directories ("Cannot find any build directories").
        env["SPARK_SCALA_VERSION"] = scala_version()
        # Executors of the stack's workers run Python (if the job needs any) with this
        # interpreter: the project's own, which has pyspark and pyarrow.
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env["SPARK_LOG_DIR"] = str(self.dir)
        # Web UIs bind here instead of every interface.
        env["SPARK_LOCAL_IP"] = self.cfg.host
        return env

    def install(self) -> None:
        if not (pyspark_home() / "jars").is_dir():
            raise ServiceError(
                f"PySpark at {pyspark_home()} has no jars/ directory; reinstall pyspark",
                details={"service": self.name},
            )
        self.dir.mkdir(parents=True, exist_ok=True)


class SparkMaster(_SparkDaemon):
    """The standalone master."""

    name = "spark-master"

    @property
    def port(self) -> int:
        return self.cfg.spark_port

    @property
    def endpoint(self) -> str:
        return spark_master_url(self.cfg)

    @property
    def log_file(self) -> Path:
        return self.dir / "master.log"

    def launch(self) -> None:
        c = self.cfg
        argv = self._argv(
            "org.apache.spark.deploy.master.Master",
            "512m",
            "--host",
            c.host,
            "--port",
            str(c.spark_port),
            "--webui-port",
            str(c.spark_port + 1),
            # The REST submission server would take port 6066, shared by every stack.
            props=("-Dspark.master.rest.enabled=false",),
        )
        spawn(argv, log_file=self.log_file, pid_file=self.pid_file, cwd=self.dir, env=self._env())

    def healthy(self, timeout: float = 5.0) -> bool:
        status = master_status(self.cfg, timeout)
        return status is not None and status.get("status") == "ALIVE"


class SparkWorker(_SparkDaemon):
    """Worker number `index`, registered with the stack's master."""

    def __init__(self, cfg: StackConfig, index: int) -> None:
        self.index = index
        self.name = f"spark-worker-{index}"
        super().__init__(cfg)

    @property
    def port(self) -> int:
        return self.cfg.spark_port + 2 + 2 * self.index

    @property
    def endpoint(self) -> str:
        return f"{self.cfg.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "worker.log"

    def launch(self) -> None:
        c = self.cfg
        argv = self._argv(
            "org.apache.spark.deploy.worker.Worker",
            "256m",
            "--host",
            c.host,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.port + 1),
            "--cores",
            str(c.spark_worker_cores),
            "--memory",
            c.spark_worker_memory,
            "--work-dir",
            str(self.dir / "work"),
            spark_master_url(c),
            # Finished applications' executor logs and files go after a day, so the state
            # dir does not grow with every test run.
            props=(
                "-Dspark.worker.cleanup.enabled=true",
                "-Dspark.worker.cleanup.appDataTtl=86400",
            ),
        )
        spawn(argv, log_file=self.log_file, pid_file=self.pid_file, cwd=self.dir, env=self._env())

    def healthy(self, timeout: float = 5.0) -> bool:
        """The master lists this worker as ALIVE (registered, not merely listening)."""
        status = master_status(self.cfg, timeout)
        if status is None:
            return False
        return any(
            w.get("port") == self.port and w.get("state") == "ALIVE"
            for w in status.get("workers", [])
        )


def spark_services(cfg: StackConfig) -> list[Service]:
    """The master, then each worker, in start order."""
    return [SparkMaster(cfg), *(SparkWorker(cfg, i) for i in range(cfg.spark_workers))]
