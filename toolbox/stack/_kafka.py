"""Apache Kafka (KRaft, one combined broker+controller node) from Maven Central jars."""

from __future__ import annotations

import base64
import logging
import os
import shutil
import uuid
from pathlib import Path

from metasrv.errors import MetasrvError, ServiceError
from metasrv.kafka import KafkaAdmin
from toolbox.stack._certs import make_pki
from toolbox.stack._config import SASL_USERS
from toolbox.stack._process import run, spawn
from toolbox.stack._service import Service

logger = logging.getLogger(__name__)

_LOG4J_VERSION = "2.24.3"
# Kafka's pom pins slf4j-api 1.7; the log4j2 SLF4J 2 provider needs the 2.x API, and a
# direct dependency wins Maven's nearest-first resolution.
_SLF4J_VERSION = "2.0.17"

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.metasrv</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>{slf4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""

# Console output goes to the log file the stack redirects stdout to, so one file holds
# both the JVM's own messages and the broker's log.
_LOG4J2 = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.log.name = kafka.log
logger.log.level = warn
logger.storage.name = org.apache.kafka.storage
logger.storage.level = warn
logger.coord.name = org.apache.kafka.coordinator
logger.coord.level = warn
logger.change.name = state.change.logger
logger.change.level = warn
logger.partition.name = kafka.cluster.Partition
logger.partition.level = warn
logger.fetcher.name = kafka.server.ReplicaFetcherManager
logger.fetcher.level = warn
logger.alterdirs.name = kafka.server.ReplicaAlterLogDirsManager
logger.alterdirs.level = warn
logger.dynconfig.name = kafka.server.metadata.DynamicConfigPublisher
logger.dynconfig.level = warn
logger.ctlconfig.name = org.apache.kafka.controller.ConfigurationControlManager
logger.ctlconfig.level = warn
"""


def java_argv(node_dir: Path, libs: Path, main: str, *args: str, heap: str) -> list[str]:
    """A Kafka JVM command line: jars from `libs`, log4j2 config and logs in `node_dir`."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else "java"
    return [
        java,
        *heap.split(),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={node_dir / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={node_dir}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


def write_log4j2(node_dir: Path) -> None:
    """The broker's log configuration (console, so the node's log file holds everything)."""
    (node_dir / "log4j2.properties").write_text(_LOG4J2)


def new_cluster_id() -> str:
    """A cluster id: an unpadded base64url random UUID, as `kafka-storage random-uuid` makes."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def format_storage(
    node_dir: Path,
    libs: Path,
    properties: Path,
    cluster_id: str,
    *,
    log_file: Path,
    extra: tuple[str, ...] = (),
) -> None:
    """`kafka-storage format` for the node whose config is `properties`."""
    run(
        java_argv(
            node_dir,
            libs,
            "kafka.tools.StorageTool",
            "format",
            # One token: an id starting with "-" (1 in 64) would read as an option.
            f"--cluster-id={cluster_id}",
            "-c",
            str(properties),
            "--ignore-formatted",
            *extra,
            heap="-Xmx256m",
        ),
        what="kafka storage format",
        log_file=log_file,
        timeout=120,
    )


class Kafka(Service):
    """A single-node KRaft cluster on 127.0.0.1."""

    name = "kafka"
    stop_grace = 45.0

    @property
    def port(self) -> int:
        return self.cfg.kafka_port

    @property
    def endpoint(self) -> str:
        return f"{self.cfg.host}:{self.cfg.kafka_port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "kafka.log"

    @property
    def libs(self) -> Path:
        """Jar directory (Kafka plus its dependencies)."""
        return self.dir / "libs"

    @property
    def marker(self) -> Path:
        """Present once the jars of `kafka_version` are fully downloaded."""
        return self.libs / f".installed-{self.cfg.kafka_version}"

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def properties(self) -> Path:
        return self.dir / "server.properties"

    def install(self) -> None:
        self.install_jars()
        self._write_config()
        if not (self.data / "meta.properties").exists():
            self._format()

    def install_jars(self) -> Path:
        """Download the jars of `kafka_version` once; the cluster's nodes share them."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.marker.exists():
            self._download()
        return self.libs

    def _download(self) -> None:
        if self.libs.exists():
            shutil.rmtree(self.libs)
        build = self.dir / "build"
        build.mkdir(exist_ok=True)
        (build / "pom.xml").write_text(
            _POM.format(kafka=self.cfg.kafka_version, log4j=_LOG4J_VERSION, slf4j=_SLF4J_VERSION)
        )
        logger.info("downloading Kafka %s jars with Maven", self.cfg.kafka_version)
        command = [
            "mvn",
            "-q",
            "-B",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={self.libs}",
            "-DincludeScope=runtime",
        ]
        # Seen once in a CI run: the copy failed with the output directory missing. The
        # directory is made first, and one failed copy is tried again before giving up.
        for attempt in (1, 2):
            self.libs.mkdir(exist_ok=True)
            try:
                log = self.dir / "install.log"
                run(command, what="kafka install (mvn)", log_file=log, cwd=build)
                break
            except ServiceError:
                if attempt == 2:
                    raise
                logger.warning("kafka install (mvn) failed; trying once more")
        self.marker.write_text(self.cfg.kafka_version + "\n")

    def _write_config(self) -> None:
        c = self.cfg
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{c.host}:{c.kafka_controller_port}",
            "listeners": f"PLAINTEXT://{c.host}:{c.kafka_port},CONTROLLER://{c.host}:{c.kafka_controller_port}",
            "advertised.listeners": f"PLAINTEXT://{c.host}:{c.kafka_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            # Small segments so DeleteRecords / retention tests see whole segments go.
            "log.segment.bytes": str(1024 * 1024),
            "log.retention.check.interval.ms": "5000",
            "log.segment.delete.delay.ms": "1000",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
        }
        props.update(self._secure_listeners())
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        write_log4j2(self.dir)

    def _secure_listeners(self) -> dict[str, str]:
        """SSL / SASL_SSL listeners when the config asks for them (inter-broker stays plain)."""
        c = self.cfg
        extra = [
            (name, port)
            for name, port in (("SSL", c.kafka_ssl_port), ("SASL_SSL", c.kafka_sasl_ssl_port))
            if port
        ]
        if not extra:
            return {}
        pki = make_pki(c.pki_dir)
        urls = "".join(f",{name}://{c.host}:{port}" for name, port in extra)
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in SASL_USERS.items())
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return {
            "listeners": f"PLAINTEXT://{c.host}:{c.kafka_port}{urls},"
            f"CONTROLLER://{c.host}:{c.kafka_controller_port}",
            "advertised.listeners": f"PLAINTEXT://{c.host}:{c.kafka_port}{urls}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
            "SSL:SSL,SASL_SSL:SASL_SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.server_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(pki.ca_cert),
            "listener.name.ssl.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            ),
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
        }

    def _java(self, main: str, *args: str, heap: str = "-Xmx256m") -> list[str]:
        return java_argv(self.dir, self.libs, main, *args, heap=heap)

    def _format(self) -> None:
        if self.data.exists():
            shutil.rmtree(self.data)
        format_storage(
            self.dir,
            self.libs,
            self.properties,
            new_cluster_id(),
            log_file=self.log_file,
            extra=tuple(self._scram_users()),
        )

    def _scram_users(self) -> list[str]:
        """`--add-scram` arguments: SCRAM credentials live in the cluster metadata."""
        if not self.cfg.kafka_sasl_ssl_port:
            return []
        return [
            arg
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
            for user, password in SASL_USERS.items()
            for arg in ("--add-scram", f"{mechanism}=[name={user},password={password}]")
        ]

    def launch(self) -> None:
        argv = self._java("kafka.Kafka", str(self.properties), heap="-Xmx1g -Xms256m")
        spawn(argv, log_file=self.log_file, pid_file=self.pid_file, cwd=self.dir)

    def healthy(self, timeout: float = 5.0) -> bool:
        admin = KafkaAdmin(self.endpoint, request_timeout=timeout)
        try:
            return admin.ping() >= 1
        except MetasrvError:
            return False
        finally:
            admin.close()
