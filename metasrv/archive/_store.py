"""The object store adapter: put, get, list, delete on an S3-compatible bucket (boto3).

Built from `[wal.archive]` (endpoint, bucket, region, credentials). Calls block; async callers
use `asyncio.to_thread`. Library errors are translated once, through `_ERRORS_BY_CODE` and
`_translate`, into `ObjectStoreUnavailable` (retryable: connection refused, timeouts,
throttling, 5xx), `ObjectStoreRejected` (not retryable: credentials, permissions, a missing
bucket, a request the server does not implement), `ObjectNotFound` and `ObjectCorrupt`.

Checksums, the portable way (docs/archive.md, "The object store"): S3Proxy answers the
flexible checksum headers (`x-amz-checksum-*`, boto3's default since 1.36) with 501, so every
request asks for checksums only where the operation requires one. A put sends `Content-MD5`,
which S3Proxy and AWS both verify (a body damaged on the way is refused, `BadDigest`), and
stores the body's SHA-256 as user metadata; a get recomputes it and refuses a mismatch. No
conditional writes either: S3Proxy ignores `If-None-Match`, and the archive needs none (an
object's key names its range, so two writers of one key write the same entries).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from metasrv.errors import (
    MetasrvError,
    ObjectCorrupt,
    ObjectNotFound,
    ObjectStoreRejected,
    ObjectStoreUnavailable,
)
from metasrv.settings import ArchiveSettings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

logger = logging.getLogger(__name__)

SHA256_METADATA = "sha256"
"""User metadata key (`x-amz-meta-sha256`) holding the hex SHA-256 of an object's body."""

_ERRORS_BY_CODE: Mapping[str, type[MetasrvError]] = {
    "NoSuchKey": ObjectNotFound,
    "NotFound": ObjectNotFound,  # HEAD's bodiless 404
    "SlowDown": ObjectStoreUnavailable,
    "ServiceUnavailable": ObjectStoreUnavailable,
    "InternalError": ObjectStoreUnavailable,
    "RequestTimeout": ObjectStoreUnavailable,
    "RequestTimeTooSkewed": ObjectStoreUnavailable,  # the clock moves back into line
    "NotImplemented": ObjectStoreRejected,  # 501, but no retry will implement it
    "BadDigest": ObjectStoreUnavailable,  # the body was damaged on the way: send it again
}
"""S3 error code -> our error; codes not listed go by HTTP status (`_translate`)."""

_TRANSPORT_ERRORS = (
    EndpointConnectionError,
    ConnectTimeoutError,
    ReadTimeoutError,
    ConnectionClosedError,
)


@dataclass(frozen=True)
class StoredObject:
    """One object a listing found."""

    key: str
    size: int
    """Bytes."""
    last_modified: datetime
    """When the store last wrote it (timezone-aware, UTC)."""


def _translate(exc: Exception, what: str) -> MetasrvError:
    """The one translation of a boto3/botocore error into the `MetasrvError` hierarchy."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        cls = _ERRORS_BY_CODE.get(code)
        if cls is None:
            retryable = status >= 500 or status in (408, 429)
            cls = ObjectStoreUnavailable if retryable else ObjectStoreRejected
        message = f"object store: {what}: {code or status} {error.get('Message', '')}".rstrip()
        return cls(message, details={"s3_code": code, "http_status": status})
    if isinstance(exc, _TRANSPORT_ERRORS):
        return ObjectStoreUnavailable(f"object store: {what}: {exc}")
    if isinstance(exc, NoCredentialsError):
        return ObjectStoreRejected(f"object store: {what}: {exc}")
    # Any other botocore error (a response it could not parse, a dropped connection it names
    # differently): the store or the way to it misbehaved; asking again may help.
    return ObjectStoreUnavailable(f"object store: {what}: {type(exc).__name__}: {exc}")


def _sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class ObjectStore:
    """One bucket of an S3-compatible store, from `[wal.archive]`. Thread-safe (boto3's
    client is). Keys are whole keys: `ArchivedRange.key(settings.prefix)` makes them."""

    def __init__(
        self,
        settings: ArchiveSettings,
        *,
        timeout: float = 10.0,
        max_attempts: int = 3,
        page_size: int = 1000,
    ) -> None:
        """`timeout`: seconds to connect and to wait for each answer; `max_attempts`: tries
        per call of botocore's own retry of transient failures before one
        `ObjectStoreUnavailable`; `page_size`: keys per ListObjectsV2 page."""
        self.bucket = settings.bucket
        self.prefix = settings.prefix
        self._page_size = page_size
        secret = settings.secret_access_key.get_secret_value()
        self._client: S3Client = boto3.client(
            "s3",
            endpoint_url=settings.endpoint or None,
            region_name=settings.region,
            # None for both: boto3's standard credential chain.
            aws_access_key_id=settings.access_key_id or None,
            aws_secret_access_key=secret or None,
            config=Config(
                connect_timeout=timeout,
                read_timeout=timeout,
                retries={"max_attempts": max_attempts, "mode": "standard"},
                # Path-style keeps bucket names with dots valid over TLS and works with any
                # S3-compatible server; AWS still serves it.
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def check(self) -> None:
        """Whether the bucket answers (HEAD bucket, which needs `s3:ListBucket`): returns, or
        raises as any other call would (a missing bucket is `ObjectStoreRejected`)."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, f"head bucket {self.bucket}") from exc

    def put(self, key: str, body: bytes) -> None:
        """Store `body` at `key` (replacing any object there), with `Content-MD5` the store
        verifies and the SHA-256 that `get` checks."""
        md5 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
        try:
            self._client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=body,
                ContentMD5=md5,
                ContentLength=len(body),
                Metadata={SHA256_METADATA: _sha256_hex(body)},
            )
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, f"put {key}") from exc

    def get(self, key: str) -> bytes:
        """The body at `key`, checked against its stored SHA-256: `ObjectNotFound` when no
        object is there, `ObjectCorrupt` when its bytes or its checksum are wrong."""
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=key)
            body = answer["Body"].read()
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, f"get {key}") from exc
        stored = answer.get("Metadata", {}).get(SHA256_METADATA)
        if stored is None:
            raise ObjectCorrupt(
                f"object store: {key} has no {SHA256_METADATA} metadata (not written by "
                "metasrv, or its metadata was lost)",
                details={"key": key},
            )
        actual = _sha256_hex(body)
        if actual != stored.lower():
            raise ObjectCorrupt(
                f"object store: {key} has SHA-256 {actual}, its metadata says {stored}",
                details={"key": key, "sha256": actual, "stored_sha256": stored},
            )
        return body

    def list(self, prefix: str) -> list[StoredObject]:
        """Every object whose key starts with `prefix`, in key order (all pages)."""
        found: list[StoredObject] = []
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": self._page_size}
        )
        try:
            for page in pages:
                found.extend(
                    StoredObject(obj["Key"], int(obj["Size"]), obj["LastModified"])
                    for obj in page.get("Contents", [])
                )
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, f"list {prefix!r}") from exc
        return found

    def delete(self, key: str) -> None:
        """Remove the object at `key`; removing one that is not there is no error."""
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, f"delete {key}") from exc

    def close(self) -> None:
        """Release the client's connections."""
        self._client.close()
