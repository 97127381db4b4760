"""How the operator commands reach metasrv: connection options, the client, exit codes.

The commands (`cli/_ops.py`, `metasrv reconcile latest`) talk to a running metasrv through
`metasrv.wire.MetasrvClient`, never to the kv backend or Kafka directly, so what an operator
sees is exactly what the API serves.

Where the server and token come from, first match wins:
`--url` / `METASRV_URL` / `http.addr` of `--config` / `127.0.0.1:4000`, and
`--token` / `METASRV_TOKEN` / the config's first operator token (viewer token for reads).

Exit codes (scripts rely on them):
0 ok; 1 a purge failed or was cancelled; 2 usage or invalid argument; 3 metasrv unreachable,
not authenticated or not authorized; 4 not found; 5 conflict; 6 `--wait` timed out;
7 any other server error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from rich.console import Console
from rich.text import Text

from cli._options import shared_options
from metasrv import errors
from metasrv.settings import load_settings
from metasrv.wire import MetasrvClient, base_url_from_addr


class Exit(IntEnum):
    """Process exit codes of the operator commands."""

    OK = 0
    PURGE_FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    NOT_FOUND = 4
    CONFLICT = 5
    TIMEOUT = 6
    SERVER_ERROR = 7


# Checked in order: the first matching base class decides the exit code.
_EXIT_BY_ERROR: tuple[tuple[type[BaseException], Exit], ...] = (
    (errors.InvalidArgument, Exit.USAGE),
    (errors.ConfigError, Exit.USAGE),
    (errors.Unavailable, Exit.UNREACHABLE),
    (errors.Unauthenticated, Exit.UNREACHABLE),
    (errors.PermissionDenied, Exit.UNREACHABLE),
    (errors.NotLeader, Exit.UNREACHABLE),
    (errors.NotFound, Exit.NOT_FOUND),
    (errors.Conflict, Exit.CONFLICT),
    (TimeoutError, Exit.TIMEOUT),
    (errors.MetasrvError, Exit.SERVER_ERROR),
)

err = Console(stderr=True, highlight=False, soft_wrap=True)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="METASRV_URL", help="metasrv base URL or host:port."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="METASRV_TOKEN", help="Bearer token.", show_default=False),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="metasrv TOML config (for http.addr and tokens)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
_CONNECTION = (("url", UrlOpt), ("token", TokenOpt), ("config", ConfigOpt))


def connected(*, write: bool) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command `--url`, `--token` and `--config` and call it with a
    `client: MetasrvClient` for them instead; `write` picks an operator token from the
    config rather than a viewer's."""
    return shared_options(
        _CONNECTION,
        into="client",
        build=lambda url, token, config: _client(url, token, config, write=write),
    )


# --- plumbing ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """Where to send requests and with which token."""

    url: str
    """Base URL of the metasrv."""
    token: str | None
    """Bearer token, if any."""


def resolve_target(
    url: str | None, token: str | None, config: Path | None, *, write: bool
) -> Target:
    """Apply the precedence rules of the module docstring."""
    if url is not None and token is not None:
        return Target(base_url_from_addr(url), token)
    settings = load_settings(config)
    if token is None:
        auth = settings.auth
        candidates = auth.operator_tokens if write else [*auth.viewer_tokens, *auth.operator_tokens]
        token = candidates[0] if candidates else None
    return Target(base_url_from_addr(url or settings.http.addr), token)


@contextmanager
def _client(
    url: str | None, token: str | None, config: Path | None, *, write: bool
) -> Iterator[MetasrvClient]:
    """A client for the resolved target; errors become exit codes with a one-line message."""
    try:
        target = resolve_target(url, token, config, write=write)
        with MetasrvClient(target.url, token=target.token) as client:
            yield client
    except (errors.MetasrvError, TimeoutError) as exc:
        code = next(c for cls, c in _EXIT_BY_ERROR if isinstance(exc, cls))
        name = getattr(exc, "code", "timeout")
        err.print(Text.assemble(("error", "bold red"), f" ({name}): {exc}"))
        raise typer.Exit(int(code)) from None


T = TypeVar("T")


def read(
    client: MetasrvClient,
    kind: type[T],
    method: str,
    path: str,
    *,
    params: dict[str, Any] | None = None,
    payload: Any = None,
) -> tuple[T, Any]:
    """One answer twice: decoded as `kind` for the tables, and as the server's JSON unchanged
    (parsed, not re-encoded from `kind`) for `--json`."""
    body = client.raw(method, path, params=params, json=payload)
    try:
        return msgspec.json.decode(body, type=kind), msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise errors.MetasrvError(f"unexpected answer to {method} {path}: {exc}") from exc


def read_json(client: MetasrvClient, answer: type[T], path: str, /, **params: Any) -> tuple[T, Any]:
    """`GET path` (see `read`): the typed answer and the server's JSON."""
    return read(client, answer, "GET", path, params=params)
