"""Calls to an etcd cluster that move to another member when the one in use fails.

pyetcd's `MultiEndpointEtcd3Client` holds one `Endpoint` per member (its gRPC channel and
a failure mark that keeps it out of use for `time_retry` seconds) and chooses the member
calls go to: the current one while it has not failed, else the first in the list that
has not failed recently. `EtcdMembers` keeps that client and its choice, and adds what it
lacks for a process calling etcd from several threads through raw stubs:

- the member marked failed is the one the failed call went to (pyetcd marks whichever
  member is current when the error is handled: with calls on several threads that can
  be a healthy member another thread has just moved to, and three such marks leave no
  member at all);
- the call is retried at once on the next member when that is safe (see `call`);
- when every member failed recently, the one that failed longest ago is tried again
  (pyetcd refuses to call at all, NoServerAvailableError, until a mark expires);
- the choice and the marks change under a lock.

A connection-level failure is UNAVAILABLE (refused, reset, or the member answered that
it cannot serve) or DEADLINE_EXCEEDED (a member that does not answer: paused, or cut off
from the others; a per-attempt deadline shorter than the caller's budget bounds how long
it takes to notice; etcd may answer UNKNOWN "context deadline exceeded" just before).
Anything else is the member's answer and is raised as it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc

from metasrv.errors import InvalidArgument
from metasrv.kv._etcd_security import EtcdSecurity
from metasrv.settings import split_host_port

logger = logging.getLogger(__name__)

T = TypeVar("T")

FAILED_MEMBER_RETRY = 2.0
"""Seconds a failed member is left out of use (when another one has not failed)."""

_CHANNEL_OPTIONS = [("grpc.max_reconnect_backoff_ms", int(FAILED_MEMBER_RETRY * 1000))]
"""gRPC backs off reconnecting to a member that went away up to 2 minutes by default, and
fails calls at once meanwhile: a restarted member would look dead that long."""

_ROUND_PAUSE = 0.2
"""Seconds a repeatable call waits before another round of the members."""

_CONNECTION_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

# gRPC's words when the channel had no connection to put the call on: nothing was sent.
# ("Stream removed", "Socket closed", "Connection reset" come after sending: unknown.)
_UNSENT_MARKERS = ("failed to connect to all addresses", "DNS resolution failed")

_SERVER_DEADLINE = "context deadline exceeded"
"""etcd's answer (code UNKNOWN) when its copy of our deadline ran out while waiting."""

_MIN_ATTEMPT = 0.05
"""Seconds: a budget left below this is not worth another attempt."""


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """'host:port' (optionally with http://) -> (host, port)."""
    parsed = split_host_port(endpoint)
    if parsed is None or not parsed[0]:
        raise InvalidArgument(f"etcd endpoint must be host:port, got {endpoint!r}")
    return parsed[0].strip("[]"), parsed[1]


def make_client(
    endpoints: Sequence[str], timeout: float, security: EtcdSecurity | None = None
) -> Any:
    """A pyetcd client over `endpoints` (plain-text gRPC unless `security` asks for TLS
    and/or a user), starting on a random member as pyetcd does."""
    security = security or EtcdSecurity()
    creds = security.channel_credentials()
    # A lone member is never left out: there is nowhere else to go.
    time_retry = FAILED_MEMBER_RETRY if len(endpoints) > 1 else 0.0
    eps = [
        pyetcd.Endpoint(
            host,
            port,
            secure=creds is not None,
            creds=creds,
            time_retry=time_retry,
            opts=_CHANNEL_OPTIONS,
        )
        for host, port in map(parse_endpoint, endpoints)
    ]
    for ep in eps:
        ep.channel = security.secure(ep.channel, timeout)
    return pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout, failover=True)


def is_connection_failure(exc: BaseException) -> bool:
    """True when `exc` says the member did not serve the call (see the module docstring)."""
    if not isinstance(exc, grpc.RpcError):
        return False
    code = _code(exc)
    if code == grpc.StatusCode.UNKNOWN:
        # etcd's own deadline ran out first (a member that cannot reach a quorum).
        return _SERVER_DEADLINE in _details(exc)
    return code in _CONNECTION_CODES


def never_sent(exc: BaseException) -> bool:
    """True when `exc` proves the request reached no member (so it cannot have applied)."""
    if not isinstance(exc, grpc.RpcError) or _code(exc) != grpc.StatusCode.UNAVAILABLE:
        return False
    return any(marker in _details(exc) for marker in _UNSENT_MARKERS)


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    return code if isinstance(code, grpc.StatusCode) else None


def _details(exc: grpc.RpcError) -> str:
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    return details or ""


@dataclass(frozen=True, slots=True)
class Stubs:
    """The gRPC stubs of one member's channel."""

    member: str
    """`host:port` of the member."""
    kv: Any
    lease: Any


class EtcdMembers:
    """The members of one etcd cluster and the one calls go to (see the module docstring)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        timeout: float,
        security: EtcdSecurity | None = None,
        *,
        name: str = "kv",
    ) -> None:
        self.client: Any = make_client(endpoints, timeout, security)
        """The pyetcd client: its endpoints, their failure marks and its current member."""
        self.name = name
        """Whose channels these are ("kv", "election"), for the logs."""
        self._lock = threading.Lock()
        self._stubs: dict[str, Stubs] = {}
        self._logged = ""  # the member last logged as in use

    @property
    def members(self) -> list[str]:
        """Every member's `host:port`, in the configured order."""
        return list(self.client.endpoints)

    @property
    def current(self) -> str:
        """The member calls go to now."""
        return self.pick().member

    def pick(self) -> Stubs:
        """Stubs of the member in use: the current one unless it failed recently, else the
        first that has not, else the one that failed longest ago."""
        with self._lock:
            client = self.client
            try:
                client.channel  # noqa: B018  (pyetcd's choice; moves off a failed member)
            except etcd_exc.NoServerAvailableError:
                oldest = min(client.endpoints.values(), key=lambda ep: ep.last_failed)
                oldest.last_failed = 0
                client._current_endpoint_label = oldest.netloc
                client.channel  # noqa: B018
            label: str = client._current_endpoint_label
            stubs = self._stubs.get(label)
            if stubs is None:
                channel = client.endpoints[label].channel
                stubs = Stubs(label, etcdrpc.KVStub(channel), etcdrpc.LeaseStub(channel))
                self._stubs[label] = stubs
            moved, self._logged = self._logged != label, label
        if moved:
            logger.info(
                "etcd %s calls go to member %s",
                self.name,
                label,
                extra={"etcd_channel": self.name, "etcd_member": label},
            )
        return stubs

    def fail(self, member: str, exc: BaseException) -> None:
        """Mark `member` failed, so calls move to another member from now on."""
        with self._lock:
            endpoint = self.client.endpoints[member]
            first = not endpoint.is_failed()
            endpoint.fail()
            if self.client._current_endpoint_label == member:
                self.client._clear_old_stubs()
        if first:
            details = getattr(exc, "details", None)
            details = details() if callable(details) else str(exc)
            logger.warning(
                "etcd member %s failed, %s calls move to another member: %s",
                member,
                self.name,
                (details or type(exc).__name__).splitlines()[0],
            )

    def move_to(self, member: str) -> None:
        """Send calls to `member` from now on (until it fails)."""
        with self._lock:
            self.client.endpoints[member].last_failed = 0
            self.client._current_endpoint_label = member

    def call(
        self,
        fn: Callable[[Stubs, float], T],
        *,
        attempt_timeout: float,
        budget: float,
        idempotent: bool,
        last_waits: bool = False,
    ) -> T:
        """`fn(stubs, timeout)` on the member in use; on a connection-level failure that
        member is marked failed and, when safe, `fn` runs again on the next member.

        Safe means `idempotent` (the caller says running `fn` twice does no harm: reads,
        lease keepalives and revokes), or the failure proves nothing was sent. Attempts
        stop after one per member (a call safe to repeat goes round the members again) or
        when `budget` seconds are spent; each gets at most
        `attempt_timeout`, but with `last_waits` the last one gets what is left (so a slow
        but healthy cluster still answers within the budget). The last failure is raised
        (a `grpc.RpcError`).
        """
        end = time.monotonic() + budget
        attempts = len(self.client.endpoints)
        while True:
            stubs = self.pick()
            left = end - time.monotonic()
            timeout = left if last_waits and attempts == 1 else min(attempt_timeout, left)
            try:
                return fn(stubs, max(timeout, _MIN_ATTEMPT))
            except grpc.RpcError as exc:
                if not is_connection_failure(exc):
                    raise
                self.fail(stubs.member, exc)
                attempts -= 1
                if end - time.monotonic() < _MIN_ATTEMPT or not (idempotent or never_sent(exc)):
                    raise
                if attempts <= 0:
                    if not idempotent or len(self.client.endpoints) == 1:
                        raise
                    # Every member of a cluster failed once, some at once (members electing a
                    # new leader answer "leader changed"): a call safe to repeat goes round
                    # again while its budget lasts, after a short pause.
                    attempts = len(self.client.endpoints)
                    time.sleep(min(_ROUND_PAUSE, max(0.0, end - time.monotonic() - _MIN_ATTEMPT)))

    def close(self) -> None:
        self.client.close()
