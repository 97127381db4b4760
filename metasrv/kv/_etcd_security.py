"""TLS and user/password authentication for etcd gRPC channels.

TLS comes from `[kv.etcd_tls]` (CA, client certificate and key). Authentication
(`[kv.etcd_auth]`) is an interceptor on the channel: it sends etcd's token as call
metadata on every request (ours call the stubs directly, so pyetcd's own per-call
metadata would not reach them) and authenticates again when the token is older than
`TOKEN_MAX_AGE`, so etcd's token TTL (5 minutes by default) never expires under us; a
request etcd answers with UNAUTHENTICATED (a token that expired anyway, e.g. with a short
`--auth-token-ttl`) drops the token, so the caller's retry authenticates again.
"""

from __future__ import annotations

import threading
import time
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from pyetcd import etcdrpc

from metasrv.errors import KvUnavailable
from metasrv.settings import KvSettings

TOKEN_MAX_AGE = 60.0
"""Seconds a token is used before authenticating again."""


@dataclass(frozen=True)
class EtcdSecurity:
    """How to reach etcd: TLS files (PEM paths) and/or user and password."""

    ca_cert: str | None = None
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_settings(cls, kv: KvSettings) -> EtcdSecurity:
        """From `[kv.etcd_tls]` and `[kv.etcd_auth]`."""
        tls, auth = kv.etcd_tls, kv.etcd_auth
        return cls(
            ca_cert=tls.ca_cert_path if tls else None,
            cert=tls.cert_path if tls else None,
            key=tls.key_path if tls else None,
            username=auth.username if auth else None,
            password=auth.password.get_secret_value() if auth else None,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials, or None for a plain-text channel."""
        if self.ca_cert is None:
            return None
        try:
            ca = Path(self.ca_cert).read_bytes()
            key = Path(self.key).read_bytes() if self.key else None
            cert = Path(self.cert).read_bytes() if self.cert else None
        except OSError as exc:
            raise KvUnavailable(f"cannot read a kv.etcd_tls file: {exc}") from exc
        return grpc.ssl_channel_credentials(ca, key, cert)

    def secure(self, channel: grpc.Channel, timeout: float) -> grpc.Channel:
        """`channel` with the token interceptor when a user is configured."""
        if self.username is None or self.password is None:
            return channel
        auth = _TokenSource(channel, self.username, self.password, timeout)
        return grpc.intercept_channel(channel, _TokenInterceptor(auth))


class _TokenSource:
    def __init__(self, channel: grpc.Channel, username: str, password: str, timeout: float):
        self._stub = etcdrpc.AuthStub(channel)
        self._username = username
        self._password = password
        self._timeout = timeout
        self._lock = threading.Lock()
        self._token = ""
        self._at = 0.0

    def metadata(self) -> tuple[tuple[str, str], ...]:
        with self._lock:
            if not self._token or time.monotonic() - self._at > TOKEN_MAX_AGE:
                self._token = self._authenticate()
                self._at = time.monotonic()
            return (("token", self._token),)

    def invalidate(self) -> None:
        with self._lock:
            self._token = ""

    def _authenticate(self) -> str:
        request = etcdrpc.AuthenticateRequest(name=self._username, password=self._password)
        try:
            response = self._stub.Authenticate(request, self._timeout)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            raise KvUnavailable(
                f"etcd refused user {self._username!r}: {details} "
                "(check kv.etcd_auth.username and kv.etcd_auth.password)"
            ) from exc
        token: str = response.token
        return token


class _Details(
    namedtuple(
        "_Details",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,  # type: ignore[misc]  # grpc ships no type hints
):
    pass


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]  # grpc ships no type hints
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, tokens: _TokenSource) -> None:
        self._tokens = tokens

    def _details(self, details: Any) -> _Details:
        return _Details(
            details.method,
            details.timeout,
            (*(details.metadata or ()), *self._tokens.metadata()),
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(self._details(details), request)
        outcome.add_done_callback(self._check)
        return outcome

    def _check(self, call: Any) -> None:
        if call.code() == grpc.StatusCode.UNAUTHENTICATED:
            self._tokens.invalidate()

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)
