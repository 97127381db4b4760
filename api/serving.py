"""Serving the app over HTTP: uvicorn with every client-controlled dimension bounded.

httptools (llhttp) has no limit on the request head, and its header callbacks grow each
header by concatenation, so one 192 MB header held the event loop for 38 s (the leader
lost its lease). `GuardedHttpProtocol` is uvicorn's httptools protocol with a byte budget
checked *before* bytes reach the parser, so the loop never does work proportional to an
oversized head:

- request line plus headers over `http.header_limit` bytes -> 431, connection closed;
- more than `http.max_headers` header fields -> 431;
- a request target (URL) over `http.url_limit` bytes -> 414;
- a request whose head and body have not fully arrived `http.read_timeout` after its
  first byte (or a connection that sends nothing for that long) -> 408, closed.

Bodies stay bounded by `http.body_limit` (api/limits.py, 413). Errors use the DESIGN §5
JSON shape. `uvicorn_config()` is the one place the daemon and the tests configure the
server, so both run with the same limits.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httptools
import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from metasrv.settings import HttpSettings

logger = logging.getLogger(__name__)

_HEAD_ENDS = (b"\r\n\r\n", b"\n\n")
_LINGER_SECONDS = 1.0
"""After a rejection, how long unread input is drained (and dropped) before closing."""
_LINGER_BYTES = 4 << 20
"""...and how much of it at most."""
_CODES = {
    408: "request_timeout",
    414: "uri_too_long",
    431: "request_header_fields_too_large",
}


class _Rejected(Exception):
    """Raised inside a parser callback to stop parsing; `data_received` answers it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_bytes(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection."""
    body = orjson.dumps({"error": {"code": _CODES[status], "message": message}})
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: ",
            str(len(body)).encode(),
            b"\r\nconnection: close\r\n\r\n",
            body,
        ]
    )


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head, header-count, URL and read-time limits.

    Class attributes hold the limits; `protocol_for(settings)` makes a subclass with the
    configured ones (uvicorn builds one protocol object per connection from the class).
    """

    header_limit = 64 * 1024
    max_headers = 100
    url_limit = 8 * 1024
    read_timeout = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._head_tail = b""
        self._read_timer: asyncio.TimerHandle | None = None
        self._lingering = -1  # bytes still dropped after a rejection; -1: not rejected

    # -- connection -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering >= 0:
            self._linger(len(data))
            return
        if self._in_head:
            if self._read_timer is None:
                self._arm_read_timer()  # first bytes of a request on a kept-alive connection
            budget = self.header_limit - self._head_bytes
            if len(data) > budget and not self._head_ends_within(data, budget):
                self._reject(431, f"request head larger than {self.header_limit} bytes")
                return
            self._head_bytes += len(data)
            self._head_tail = data[-3:]
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            rejected = exc.__context__
            if isinstance(rejected, _Rejected):
                self._reject(rejected.status, rejected.message)
                return
            logger.info("invalid HTTP request", extra={"error": str(exc)})
            self.send_400_response("Invalid HTTP request received.")

    def _head_ends_within(self, data: bytes, budget: int) -> bool:
        # Only the allowed bytes are searched: the rest of a chunk that ends the head
        # legitimately is body.
        window = self._head_tail + data[: max(budget, 0)]
        return any(end in window for end in _HEAD_ENDS)

    # -- parser callbacks ---------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._in_head = False
        if len(self.url) > self.url_limit:
            raise _Rejected(414, f"request target longer than {self.url_limit} bytes")
        if len(self.headers) > self.max_headers:
            raise _Rejected(431, f"more than {self.max_headers} header fields")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm_read_timer()
        self._in_head = True
        self._head_bytes = 0
        self._head_tail = b""

    # -- read deadline ------------------------------------------------------------------

    def _arm_read_timer(self) -> None:
        self._disarm_read_timer()
        self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _disarm_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.response_started:
            # The app already answered (a 413, say) while the body still trickles in.
            self._close_cycle()
            self.transport.close()
            return
        self._reject(408, f"request not received within {self.read_timeout:g} s")

    # -- answering ----------------------------------------------------------------------

    def _reject(self, status: int, message: str) -> None:
        logger.info(
            "request rejected",
            extra={"status": status, "reason": message, "client": self.client},
        )
        self._disarm_read_timer()
        self._close_cycle()
        self.transport.write(error_bytes(status, message))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        # Closing with unread input would send a TCP reset, which can destroy the answer
        # before the client reads it: send FIN, drop input for a moment, then close.
        self.transport.write_eof()
        self._lingering = _LINGER_BYTES
        self.loop.call_later(_LINGER_SECONDS, self.transport.close)

    def _linger(self, size: int) -> None:
        self._lingering = max(self._lingering - size, 0)
        if not self._lingering:
            self.transport.close()

    def _close_cycle(self) -> None:
        """An app task still waiting for this request's body sees a disconnect."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()


def protocol_for(http: HttpSettings) -> type[GuardedHttpProtocol]:
    """A `GuardedHttpProtocol` subclass carrying the configured limits."""
    return type(
        "ConfiguredHttpProtocol",
        (GuardedHttpProtocol,),
        {
            "header_limit": http.header_limit,
            "max_headers": http.max_headers,
            "url_limit": http.url_limit,
            "read_timeout": http.read_timeout,
        },
    )


def uvicorn_config(
    app: Any, http: HttpSettings, host: str, port: int, **options: Any
) -> uvicorn.Config:
    """The server configuration for `app`: the guarded protocol plus `options`."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_for(http),
        ws="none",
        lifespan="on",
        log_config=None,
        access_log=False,
        server_header=False,
        **options,
    )
