"""Bearer-token authorization by role (DESIGN §5, `[auth]` in §6).

Roles and the endpoints they may call:
- datanode tokens: the datanode endpoints only (`POST /v1/heartbeat`,
  `GET /v1/regions/{id}/replay-start`);
- operator tokens: the operator endpoints, and everything a viewer may read (and
  `replay-start`, which operators use when restoring a region by hand);
- viewer tokens: the read endpoints.

A role whose token list is EMPTY leaves that role's endpoints OPEN: the embedded default
configuration has no tokens at all, so a bare `metasrv start` is usable locally. Closed by
default elsewhere: `metasrv start` bound to anything but loopback refuses to start while
any role is open unless `auth.allow_open = true` (`check_exposure`), and logs every open
role as a warning at start. `open_read = true` opens the read endpoints even when viewer
tokens are set. Tokens may come from files (`*_token_files`, metasrv/settings/_sections.py).
Tokens are compared with `hmac.compare_digest`, against every configured token, so the
time taken does not depend on how much of a token matched.
Missing or unknown token: 401; a valid token of a role the endpoint does not admit: 403.
`/healthz`, `/readyz` and the dashboard page need no token.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from metasrv.errors import ConfigError, PermissionDenied, Unauthenticated
from metasrv.settings import AuthSettings

logger = logging.getLogger(__name__)


class Role(StrEnum):
    """Who a token belongs to."""

    DATANODE = "datanode"
    OPERATOR = "operator"
    VIEWER = "viewer"


class Access(StrEnum):
    """Which kind of endpoint is being called."""

    DATANODE = "datanode"
    """Heartbeats."""
    REPLAY = "replay"
    """Replay start: datanodes, and operators."""
    OPERATOR = "operator"
    """Changes: register/remove regions, purge, cancel."""
    VIEWER = "viewer"
    """Reads."""


_ADMITS: dict[Access, frozenset[Role]] = {
    Access.DATANODE: frozenset({Role.DATANODE}),
    Access.REPLAY: frozenset({Role.DATANODE, Role.OPERATOR}),
    Access.OPERATOR: frozenset({Role.OPERATOR}),
    Access.VIEWER: frozenset({Role.VIEWER, Role.OPERATOR}),
}


class Authenticator:
    """Checks a bearer token against the configured tokens of each role."""

    def __init__(self, auth: AuthSettings) -> None:
        self._tokens: list[tuple[bytes, Role]] = [
            *((t.encode(), Role.DATANODE) for t in auth.datanode_tokens),
            *((t.encode(), Role.OPERATOR) for t in auth.operator_tokens),
            *((t.encode(), Role.VIEWER) for t in auth.viewer_tokens),
        ]
        self._open = {
            Access.DATANODE: not auth.datanode_tokens,
            Access.REPLAY: not auth.datanode_tokens,
            Access.OPERATOR: not auth.operator_tokens,
            Access.VIEWER: auth.open_read or not auth.viewer_tokens,
        }

    def is_open(self, access: Access) -> bool:
        """True when the endpoint kind needs no token under this configuration."""
        return self._open[access]

    def roles_of(self, token: str) -> set[Role]:
        """Every role `token` is configured for (compares against all tokens)."""
        given = token.encode()
        roles: set[Role] = set()
        for known, role in self._tokens:
            if hmac.compare_digest(given, known):
                roles.add(role)
        return roles

    def check(self, token: str | None, access: Access) -> None:
        """Raise `Unauthenticated` (401) or `PermissionDenied` (403) unless admitted."""
        if self._open[access]:
            return
        if not token:
            raise Unauthenticated("missing bearer token (Authorization: Bearer <token>)")
        roles = self.roles_of(token)
        if not roles:
            raise Unauthenticated("unknown bearer token")
        if not roles & _ADMITS[access]:
            raise PermissionDenied(
                f"a {'/'.join(sorted(roles))} token may not call this endpoint",
                details={"required": sorted(_ADMITS[access])},
            )


def open_roles(auth: AuthSettings) -> list[str]:
    """What is reachable without a token, e.g. `["operator (no operator_tokens)"]`."""
    found = []
    for role, tokens in (
        ("datanode", auth.datanode_tokens),
        ("operator", auth.operator_tokens),
        ("viewer", auth.viewer_tokens),
    ):
        if not tokens:
            found.append(f"{role} (no {role}_tokens)")
    if auth.open_read and auth.viewer_tokens:
        found.append("viewer (open_read = true)")
    return found


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IPs (127.0.0.0/8, ::1); wildcards are not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_exposure(auth: AuthSettings, host: str) -> None:
    """Refuse (`ConfigError`) to serve open roles on a non-loopback `host` unless
    `auth.allow_open`; log each open role as a warning either way."""
    opened = open_roles(auth)
    if not opened:
        return
    if not is_loopback(host) and not auth.allow_open:
        raise ConfigError(
            f"refusing to serve on {host} with endpoints open to anyone: "
            + ", ".join(opened)
            + ". Set tokens for every role ([auth] *_tokens or *_token_files), bind "
            "http.addr to loopback, or set [auth] allow_open = true to accept this"
        )
    for role in opened:
        logger.warning("endpoints open without a token: %s", role, extra={"host": host})


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None without the header.

    A header in any other form is as bad as a wrong token (401).
    """
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token


def authorize(request: Request, access: Access) -> None:
    """Admit the request to an endpoint of kind `access`, or raise 401/403.

    A plain call (no dependency injection) so the heartbeat hot path can use it directly.
    """
    authenticator: Authenticator = request.app.state.auth
    if authenticator.is_open(access):
        return
    authenticator.check(bearer_token(request), access)


_bearer = HTTPBearer(auto_error=False, description="Per-role token from [auth] in the config.")

# Declares the bearer scheme in OpenAPI; `authorize` does the actual parsing.
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]

BEARER_SECURITY: list[dict[str, list[str]]] = [{"HTTPBearer": []}]
"""OpenAPI `security` of a route that calls `authorize` itself."""


def _require(access: Access) -> Any:
    async def check(request: Request, _documented: Credentials) -> None:
        authorize(request, access)

    check.__name__ = f"require_{access.value}"
    return Depends(check)


RequireReplay = _require(Access.REPLAY)
"""Route dependency: replay start (datanode or operator)."""
RequireOperator = _require(Access.OPERATOR)
"""Route dependency: operator endpoints."""
RequireViewer = _require(Access.VIEWER)
"""Route dependency: read endpoints (viewer or operator)."""
