"""`ObjectStore` against the real S3-compatible server of the stack (S3Proxy): checksums kept
and checked, paginated listings, deletes, and each failure as its `metasrv.errors` class,
including a server that is paused (SIGSTOP) or killed (SIGKILL)."""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Iterator
from datetime import timedelta

import pytest

from metasrv.archive import SHA256_METADATA, ArchivedRange, ObjectStore, topic_prefix
from metasrv.errors import (
    ObjectCorrupt,
    ObjectNotFound,
    ObjectStoreRejected,
    ObjectStoreUnavailable,
)
from metasrv.settings import ArchiveSettings
from tests._archive import archive_settings
from tests._wait import wait_until
from toolbox.simulator import free_port
from toolbox.stack import (
    S3Endpoint,
    StackConfig,
    s3_client,
    s3_endpoint_of,
    service_pid,
    start_service,
)


@pytest.fixture
def store(s3_endpoint: S3Endpoint, s3_prefix: str) -> Iterator[ObjectStore]:
    client = ObjectStore(archive_settings(s3_endpoint, s3_prefix), page_size=2)
    yield client
    for obj in client.list(s3_prefix):
        client.delete(obj.key)
    client.close()


def test_put_then_get_returns_the_bytes_and_keeps_their_sha256(
    store: ObjectStore, s3_endpoint: S3Endpoint, s3_prefix: str
) -> None:
    key = ArchivedRange("wal_topic_0", 0, 99).key(store.prefix)
    body = os.urandom(256 * 1024)
    store.put(key, body)
    assert store.get(key) == body
    head = s3_client(s3_endpoint.endpoint).head_object(Bucket=s3_endpoint.bucket, Key=key)
    assert head["Metadata"][SHA256_METADATA] == hashlib.sha256(body).hexdigest()
    store.put(key, b"replaced")  # no conditional write: a second put replaces
    assert store.get(key) == b"replaced"


def test_an_object_whose_bytes_do_not_match_its_sha256_is_corrupt(
    store: ObjectStore, s3_endpoint: S3Endpoint, s3_prefix: str
) -> None:
    raw = s3_client(s3_endpoint.endpoint)
    raw.put_object(
        Bucket=s3_endpoint.bucket,
        Key=f"{s3_prefix}bad",
        Body=b"these bytes",
        Metadata={SHA256_METADATA: hashlib.sha256(b"other bytes").hexdigest()},
    )
    raw.put_object(Bucket=s3_endpoint.bucket, Key=f"{s3_prefix}bare", Body=b"no checksum")
    with pytest.raises(ObjectCorrupt, match="metadata says") as info:
        store.get(f"{s3_prefix}bad")
    assert not info.value.retryable
    with pytest.raises(ObjectCorrupt, match="no sha256 metadata"):
        store.get(f"{s3_prefix}bare")


def test_a_missing_key_is_not_found(store: ObjectStore, s3_prefix: str) -> None:
    with pytest.raises(ObjectNotFound) as info:
        store.get(f"{s3_prefix}nothing-here")
    assert not info.value.retryable and info.value.details["s3_code"] == "NoSuchKey"


def test_list_reads_every_page_in_key_order_and_only_under_the_prefix(
    store: ObjectStore, s3_prefix: str
) -> None:
    ranges = [ArchivedRange("wal_topic_1", 10 * i, 10 * i + 9) for i in (3, 0, 4, 1, 2)]
    for r in ranges:
        store.put(r.key(store.prefix), b"x" * r.first_entry_id)
    # Keys a prefix listing of wal_topic_1/ must not return.
    store.put(ArchivedRange("wal_topic_10", 0, 1).key(store.prefix), b"other topic")
    store.put(f"{s3_prefix}wal_topic_1.extra", b"beside the folder")

    found = store.list(topic_prefix(store.prefix, "wal_topic_1"))  # page_size=2: 3 pages
    assert [o.key for o in found] == [r.key(store.prefix) for r in sorted(ranges)]
    assert [o.size for o in found] == [0, 10, 20, 30, 40]
    assert all(o.last_modified.tzinfo is not None for o in found)
    assert found[0].last_modified.utcoffset() == timedelta(0)
    assert len(store.list(s3_prefix)) == 7
    assert store.list(f"{s3_prefix}nothing/") == []


def test_delete_removes_and_deleting_again_is_fine(store: ObjectStore, s3_prefix: str) -> None:
    key = f"{s3_prefix}gone"
    store.put(key, b"soon gone")
    store.delete(key)
    with pytest.raises(ObjectNotFound):
        store.get(key)
    store.delete(key)
    assert store.list(s3_prefix) == []


def test_wrong_credentials_and_a_missing_bucket_are_rejected_not_retried(
    s3_endpoint: S3Endpoint, s3_prefix: str
) -> None:
    bad_secret = ObjectStore(
        archive_settings(s3_endpoint, s3_prefix, secret_access_key="not-the-secret"), max_attempts=1
    )
    with pytest.raises(ObjectStoreRejected) as info:
        bad_secret.put(f"{s3_prefix}x", b"x")
    assert not info.value.retryable and info.value.details["http_status"] == 403
    with pytest.raises(ObjectStoreRejected):
        bad_secret.list(s3_prefix)
    with pytest.raises(ObjectStoreRejected):
        bad_secret.check()

    no_bucket = ObjectStore(archive_settings(s3_endpoint, s3_prefix, bucket="no-such-bucket-here"))
    with pytest.raises(ObjectStoreRejected) as missing:
        no_bucket.get(f"{s3_prefix}x")
    assert missing.value.details["s3_code"] == "NoSuchBucket"
    with pytest.raises(ObjectStoreRejected):
        no_bucket.list(s3_prefix)
    with pytest.raises(ObjectStoreRejected) as head:
        no_bucket.check()
    assert head.value.details["http_status"] == 404
    ObjectStore(archive_settings(s3_endpoint, s3_prefix)).check()  # the real bucket answers


def test_nothing_listening_is_unavailable_and_retryable(s3_prefix: str) -> None:
    settings = ArchiveSettings.model_validate(
        {
            "endpoint": f"http://127.0.0.1:{free_port()}",
            "access_key_id": "a",
            "secret_access_key": "b",
        }
    )
    store = ObjectStore(settings, timeout=1.0, max_attempts=1)
    for call in (
        lambda: store.put(f"{s3_prefix}x", b"x"),
        lambda: store.get(f"{s3_prefix}x"),
        lambda: store.list(s3_prefix),
        lambda: store.delete(f"{s3_prefix}x"),
        store.check,
    ):
        with pytest.raises(ObjectStoreUnavailable) as info:
            call()
        assert info.value.retryable


def test_a_paused_then_killed_server_is_unavailable_until_it_is_back(
    own_server: StackConfig, s3_prefix: str
) -> None:
    store = ObjectStore(
        archive_settings(s3_endpoint_of(own_server), s3_prefix), timeout=1.0, max_attempts=1
    )
    key = f"{s3_prefix}during-faults"
    store.put(key, b"before")
    pid = service_pid(own_server, "s3")
    assert pid is not None

    os.kill(pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
    try:
        with pytest.raises(ObjectStoreUnavailable, match=r"timeout|timed out"):
            store.get(key)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert store.get(key) == b"before"

    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: service_pid(own_server, "s3") is None, timeout=10, what="s3 exits")
    with pytest.raises(ObjectStoreUnavailable) as refused:
        store.put(key, b"while down")
    assert refused.value.retryable

    start_service(own_server, "s3")
    assert store.get(key) == b"before"  # the filesystem backend kept it
    store.put(key, b"after")
    assert store.get(key) == b"after"
