"""An S3-compatible object store: S3Proxy with its filesystem backend, from Maven Central.

One self-contained jar (`s3proxy-<version>-jar-with-dependencies.jar`), checked against the
`.sha1` Maven Central publishes beside it, run with the machine's Java (17, as Kafka). Objects
live as plain files under `<state dir>/s3/data/<bucket>/`; the stack creates its bucket
(`S3_BUCKET`) once the server answers. Why S3Proxy, and what its filesystem backend does with
conditional writes and checksums: docs/archive.md, "The object store".
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from metasrv.errors import ServiceError
from toolbox.stack._config import S3_ACCESS_KEY_ID, S3_BUCKET, S3_SECRET_ACCESS_KEY
from toolbox.stack._process import spawn
from toolbox.stack._service import Service

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

logger = logging.getLogger(__name__)

S3PROXY_VERSION = "2.7.0"
"""S3Proxy release the stack installs."""

_MAVEN = "https://repo1.maven.org/maven2/org/gaul/s3proxy"
_DOWNLOAD_CHUNK = 1 << 20


def jar_url(version: str) -> str:
    """Maven Central URL of S3Proxy's self-contained jar (its checksum is this + `.sha1`)."""
    return f"{_MAVEN}/{version}/s3proxy-{version}-jar-with-dependencies.jar"


def _fetch(url: str, timeout: float = 60.0) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data: bytes = resp.read()
            return data
    except (OSError, urllib.error.URLError) as exc:
        raise ServiceError(f"s3 install: cannot download {url}: {exc}") from exc


def download_verified(url: str, target: Path, timeout: float = 600.0) -> None:
    """Download `url` to `target`, checked against the SHA-1 Maven Central publishes at
    `url + ".sha1"`; `target` appears only once it matches (a partial download never does)."""
    expected = _fetch(url + ".sha1").decode().split()[0].strip().lower()
    partial = target.with_name(target.name + ".part")
    digest = hashlib.sha1(usedforsecurity=False)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(partial, "wb") as out:
            while chunk := resp.read(_DOWNLOAD_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except (OSError, urllib.error.URLError) as exc:
        partial.unlink(missing_ok=True)
        raise ServiceError(f"s3 install: cannot download {url}: {exc}") from exc
    if digest.hexdigest() != expected:
        partial.unlink(missing_ok=True)
        raise ServiceError(
            f"s3 install: {url} has SHA-1 {digest.hexdigest()}, Maven Central says {expected}",
            details={"service": "s3", "url": url},
        )
    partial.replace(target)


def s3_client(endpoint: str, timeout: float = 5.0) -> S3Client:
    """A boto3 client of the stack's server with the stack's credentials, no retries, and
    checksums only where the operation requires one (S3Proxy answers boto3's default CRC32
    headers with 501 NotImplemented)."""
    import boto3
    from botocore.config import Config

    client: S3Client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=S3_ACCESS_KEY_ID,
        aws_secret_access_key=S3_SECRET_ACCESS_KEY,
        config=Config(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    return client


class S3Proxy(Service):
    """S3Proxy on 127.0.0.1 with the filesystem backend and AWS v2/v4 signatures."""

    name = "s3"
    stop_grace = 15.0

    @property
    def port(self) -> int:
        return self.cfg.s3_port

    @property
    def endpoint(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.s3_port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "s3proxy.log"

    @property
    def jar(self) -> Path:
        return self.dir / f"s3proxy-{S3PROXY_VERSION}.jar"

    @property
    def data(self) -> Path:
        """The filesystem backend's root: one directory per bucket."""
        return self.dir / "data"

    @property
    def properties(self) -> Path:
        return self.dir / "s3proxy.conf"

    def install(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(exist_ok=True)
        if not self.jar.exists():
            url = jar_url(S3PROXY_VERSION)
            logger.info("downloading S3Proxy %s from Maven Central", S3PROXY_VERSION)
            download_verified(url, self.jar)
        props = {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": S3_ACCESS_KEY_ID,
            "s3proxy.credential": S3_SECRET_ACCESS_KEY,
            # The NIO.2 filesystem backend: the older "filesystem" one is deprecated since 2.5.
            "jclouds.provider": "filesystem-nio2",
            "jclouds.identity": S3_ACCESS_KEY_ID,
            "jclouds.credential": S3_SECRET_ACCESS_KEY,
            "jclouds.filesystem.basedir": str(self.data),
        }
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def launch(self) -> None:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else "java"
        argv = [
            java,
            "-Xmx256m",
            "-Djava.awt.headless=true",
            # No logback start-up chatter in the log, only S3Proxy's own lines.
            "-Dlogback.statusListenerClass=ch.qos.logback.core.status.NopStatusListener",
            "-jar",
            str(self.jar),
            "--properties",
            str(self.properties),
        ]
        env = dict(os.environ)
        # S3Proxy's logback configuration reads its level from the environment.
        env.setdefault("LOG_LEVEL", "info")
        spawn(argv, log_file=self.log_file, pid_file=self.pid_file, cwd=self.dir, env=env)

    def healthy(self, timeout: float = 5.0) -> bool:
        """A signed ListBuckets succeeds (the server runs and knows the stack's credentials)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3_client(self.endpoint, timeout).list_buckets()
        except (BotoCoreError, ClientError):
            return False
        return True

    def ensure_bucket(self) -> None:
        """Create `S3_BUCKET` unless it exists."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = s3_client(self.endpoint, timeout=30.0)
        try:
            names = {b.get("Name") for b in client.list_buckets().get("Buckets", [])}
            if S3_BUCKET not in names:
                client.create_bucket(Bucket=S3_BUCKET)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                return  # another session created it a moment ago
            raise ServiceError(f"s3: cannot create bucket {S3_BUCKET}: {exc}") from exc
        except BotoCoreError as exc:
            raise ServiceError(f"s3: cannot create bucket {S3_BUCKET}: {exc}") from exc
