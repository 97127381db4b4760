"""How the Kafka adapter reads librdkafka's errors: the one translation table into the metasrv
hierarchy, the errors that mean the client's metadata is stale, and the credential and TLS
failures that no retry fixes.

`translate_kafka_error` maps each error code once: `REJECTED_CODES` become `KafkaRejected`
(not retryable), `NOT_FOUND_CODES` `NotFound`, `INVALID_INPUT_CODES` `InvalidArgument` (a
topic name Kafka refuses is the caller's error, never a temporary one), an error that names
the client's credentials `KafkaRejected` with the settings to check, and the rest
`KafkaUnavailable` (retryable).
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException

from metasrv.errors import (
    InvalidArgument,
    KafkaRejected,
    KafkaUnavailable,
    MetasrvError,
    NotFound,
)

REJECTED_CODES = {
    KafkaError.POLICY_VIOLATION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    # A pinned consumer group whose offsets we may not read (Describe on the group).
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.INVALID_CONFIG,
    KafkaError.INVALID_REPLICATION_FACTOR,
    KafkaError.INVALID_PARTITIONS,
    KafkaError.INVALID_REQUEST,
    KafkaError.UNSUPPORTED_VERSION,
    KafkaError._INVALID_ARG,
}
INVALID_INPUT_CODES = {
    # InvalidTopicException: an illegal name, or one colliding with an existing topic.
    KafkaError.TOPIC_EXCEPTION,
}
NOT_FOUND_CODES = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
}
# After a broker restart the leader epoch moves on, but librdkafka's admin ListOffsets keeps
# sending the cached epoch and fails with FENCED_LEADER_EPOCH until its metadata refreshes
# (minutes; librdkafka issue #4620). On these errors the client is rebuilt, so the caller's
# retry starts with fresh metadata. A client that asked while the restarted broker had not
# yet loaded its topics can likewise keep answering UNKNOWN_TOPIC_OR_PART for a topic that
# exists (seen for over a minute in the fault suite), so "unknown topic" rebuilds it too;
# rebuilds are rate-limited, since a topic that is really gone gives the same error.
STALE_METADATA_CODES = {
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._NOENT,
    # A request that timed out locally was most likely sent to a dead partition leader the
    # cached metadata still names: librdkafka refreshes topic metadata every 5 minutes only
    # (topic.metadata.refresh.interval.ms), and an admin request waiting for a down broker
    # spins (`KafkaAdmin._conf`), so a local timeout rebuilds too. REQUEST_TIMED_OUT does not:
    # it is a live broker's answer (DeleteRecords waited `delete_records_wait` for the
    # followers), and a fresh client could pick a hung broker for its first metadata.
    KafkaError._TIMED_OUT,
}
# Errors that a retry cannot fix: the client's own credentials or certificates are wrong.
# Each names the settings to check; librdkafka reports them through `error_cb` (requests
# then only time out), or as the request's error.
_CREDENTIAL_HINTS = {
    KafkaError._AUTHENTICATION: "check wal.sasl (type, username, password)",
    KafkaError.SASL_AUTHENTICATION_FAILED: "check wal.sasl (type, username, password)",
    KafkaError.UNSUPPORTED_SASL_MECHANISM: "check wal.sasl.type",
    KafkaError.ILLEGAL_SASL_STATE: "check wal.sasl and whether the listener expects SASL",
    KafkaError._SSL: "check wal.tls (server_ca_cert_path, client_cert_path, client_key_path)",
}
# A broker that rejects our certificate (or sees no TLS at all) closes the connection with
# an alert, which librdkafka reports as a transport failure naming OpenSSL.
_TLS_TRANSPORT_MARKERS = ("SSL routines", "certificate", "SSL handshake")


def credential_hint(err: KafkaError) -> str | None:
    """Which settings to check when `err` says our credentials or certificates are wrong."""
    hint = _CREDENTIAL_HINTS.get(err.code())
    tls_alert = any(marker in err.str() for marker in _TLS_TRANSPORT_MARKERS)
    if hint is None and err.code() == KafkaError._TRANSPORT and tls_alert:
        hint = _CREDENTIAL_HINTS[KafkaError._SSL]
    return hint


def translate_kafka_error(exc: BaseException, what: str) -> MetasrvError:
    """Map a confluent-kafka error onto the metasrv hierarchy (the one translation table)."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if isinstance(err, KafkaError):
        code = err.code()
        text = f"{what}: {err.name()}: {err.str()}"
        hint = credential_hint(err)
        if hint is not None:
            return KafkaRejected(f"{text} ({hint})", details={"kafka_error": err.name()})
        if code in NOT_FOUND_CODES:
            return NotFound(text, details={"kafka_error": err.name()})
        if code in INVALID_INPUT_CODES:
            return InvalidArgument(text, details={"kafka_error": err.name()})
        if code in REJECTED_CODES:
            return KafkaRejected(text, details={"kafka_error": err.name()})
        return KafkaUnavailable(text, details={"kafka_error": err.name()})
    return KafkaUnavailable(f"{what}: {exc}")


class CredentialErrors:
    """librdkafka's `error_cb`: authentication and TLS failures surface only there (the
    request itself fails with a transport error). Not a bound method of the admin, so the
    client does not keep its owner alive."""

    def __init__(self) -> None:
        self._last: tuple[float, KafkaError] | None = None

    def __call__(self, err: KafkaError) -> None:
        if credential_hint(err) is not None:
            self._last = (time.monotonic(), err)

    def take(self, within: float) -> KafkaError | None:
        """The latest one seen in the last `within` seconds, once (a transient TLS error
        must not turn later, unrelated failures into non-retryable ones)."""
        last, self._last = self._last, None
        if last is None or time.monotonic() - last[0] > within:
            return None
        return last[1]
