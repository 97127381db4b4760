"""The one error hierarchy of metasrv.

Every error raised on purpose derives from `MetasrvError`. Subclasses say whether a
procedure step that raised them may be retried, and the API maps each base class to
one HTTP status (api/errors.py), so routes never translate errors themselves.
"""

from __future__ import annotations

from typing import Any


class MetasrvError(Exception):
    """Base of every metasrv error.

    `code` is the stable machine-readable name used in the HTTP error body.
    `retryable` tells the procedure runner whether retrying the step may help.
    `next_retry_delay` (seconds) overrides the runner's backoff when set.
    """

    code = "internal"
    retryable = False

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retryable: bool | None = None,
        next_retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        if retryable is not None:
            self.retryable = retryable
        self.next_retry_delay = next_retry_delay


# --- caller errors (4xx) -------------------------------------------------------------


class InvalidArgument(MetasrvError):
    """The request is well-formed JSON but asks for something that makes no sense."""

    code = "invalid_argument"


class SchemaError(InvalidArgument):
    """A request body (or its field) does not match the wire schema (`metasrv.wire`)."""

    code = "validation_error"


class NotFound(MetasrvError):
    """A named region, topic, procedure or key does not exist."""

    code = "not_found"


class Conflict(MetasrvError):
    """The request conflicts with current state (already exists, wrong state, lost CAS)."""

    code = "conflict"


class Unauthenticated(MetasrvError):
    """No bearer token, or one that matches no configured token."""

    code = "unauthenticated"


class PermissionDenied(MetasrvError):
    """The token is valid but its role may not call this endpoint."""

    code = "permission_denied"


class NotLeader(MetasrvError):
    """This metasrv is a follower; `leader` names the address to use instead."""

    code = "not_leader"

    def __init__(self, leader: str | None) -> None:
        super().__init__(
            f"this metasrv is not the leader; leader is {leader or 'unknown'}",
            details={"leader": leader},
        )
        self.leader = leader


# --- system errors ---------------------------------------------------------------------


class Unavailable(MetasrvError):
    """A dependency (kv backend, Kafka, SQL) did not answer; trying again may help."""

    code = "unavailable"
    retryable = True


class KvUnavailable(Unavailable):
    """The kv backend (etcd or SQL) could not be reached or timed out."""

    code = "kv_unavailable"


class KafkaUnavailable(Unavailable):
    """Kafka transport error, timeout or leader movement."""

    code = "kafka_unavailable"


class ObjectStoreUnavailable(Unavailable):
    """The WAL archive's object store did not answer, timed out, throttled, failed (5xx) or
    received a damaged body (BadDigest): asking again may help."""

    code = "object_store_unavailable"


class ObjectStoreRejected(MetasrvError):
    """The object store refused the request for a reason retrying cannot fix (credentials,
    permissions, a missing bucket, a request it does not implement)."""

    code = "object_store_rejected"


class ObjectNotFound(NotFound):
    """No archived object has the key asked for."""

    code = "object_not_found"


class ObjectCorrupt(MetasrvError):
    """An archived object's bytes do not match the SHA-256 stored with it."""

    code = "object_corrupt"


class KafkaRejected(MetasrvError):
    """Kafka refused the request for a reason retrying cannot fix (policy, authorization)."""

    code = "kafka_rejected"


class TxnTooLarge(MetasrvError):
    """An atomic kv transaction asked for more operations than the backend allows."""

    code = "txn_too_large"


class LockNotAcquired(MetasrvError):
    """A topic lock could not be taken in time; retrying later may succeed."""

    code = "lock_not_acquired"
    retryable = True


class LeadershipLost(MetasrvError):
    """This process stopped being leader while doing leader-only work (fenced)."""

    code = "leadership_lost"


class Cancelled(MetasrvError):
    """An operator cancelled the procedure."""

    code = "cancelled"


class WalDataLoss(MetasrvError):
    """Kafka's log start is above an entry a region still needs (DESIGN §2, invariant 7)."""

    code = "wal_data_loss"


class TopicReset(Conflict):
    """A topic's offsets went backwards under metasrv, or its Kafka topic id is not the one
    its marker records (DESIGN §2 invariant 8): nothing is deleted from it and no offset
    of it is answered until an operator resolves the reset."""

    code = "topic_reset"


class DamagedMarker(MetasrvError):
    """A topic's stored marker does not decode: metasrv's own state is damaged, no retry or
    other request can succeed until an operator repairs the key (500, logged as an error;
    not 503, which datanodes retry as a leader loading, and never read as "never purged")."""

    code = "damaged_marker"


class ConfigError(MetasrvError):
    """The configuration file or environment holds an invalid value."""

    code = "config_error"


class ServiceError(MetasrvError):
    """A local stack service (Kafka, etcd, PostgreSQL) failed to install or start."""

    code = "service_error"
