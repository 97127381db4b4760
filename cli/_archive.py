"""`metasrv archive -c FILE`: one WAL archiver (DESIGN §8), with /metrics and /readyz.

The archiver (`metasrv.archive.Archiver`) runs in the main thread; a small HTTP server on
`[http] addr` serves `/metrics` (Prometheus), `/readyz` (200 once the group has assigned this
archiver its topics and the object store answers, else 503) and `/healthz`. Logs are JSON
lines, as `metasrv start` writes them. SIGTERM or SIGINT: the object being written is finished
or abandoned (never a range committed unverified), the archiver leaves its group, exit 0.

It refuses to start (exit 2) when `[wal.archive] enabled` is false, and (exit 1) when the object
store does not answer within `--store-wait` seconds. `METASRV_ARCHIVER_PAUSE_AT` (tests only)
names a `PausePoint` where the archiver stops, so a test can kill it there.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from cli._daemon import configure_logging, split_addr
from metasrv.errors import ConfigError, MetasrvError
from metasrv.settings import Settings, load_settings

if TYPE_CHECKING:
    from metasrv.archive import Archiver, ObjectStore

PAUSE_ENV = "METASRV_ARCHIVER_PAUSE_AT"
"""Tests only: a `PausePoint` value where the archiver stops until it is signalled."""

logger = logging.getLogger(__name__)


def wait_for_store(store: ObjectStore, within: float, stop: threading.Event) -> bool:
    """True once the bucket answers, False when `stop` is set first; raise the last
    `MetasrvError` when it does not answer within `within` seconds, or at once when the store
    refuses (credentials, a missing bucket)."""
    deadline = time.monotonic() + within
    delay = 0.5
    while not stop.is_set():
        try:
            store.check()
            return True
        except MetasrvError as exc:
            left = deadline - time.monotonic()
            if not exc.retryable or left <= 0:
                raise
            logger.warning(
                "object store not answering; trying again",
                extra={"error": str(exc), "seconds_left": round(left, 1)},
            )
            stop.wait(min(delay, left))
            delay = min(delay * 2, 5.0)
    return False


def _handler(archiver: Archiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, archiver.metrics.render(), "text/plain; version=0.0.4")
            elif path == "/readyz":
                ready = archiver.ready
                body = {"ready": ready, "assigned": archiver.assigned}
                self._send(200 if ready else 503, orjson.dumps(body), "application/json")
            elif path == "/healthz":
                self._send(200, orjson.dumps({"status": "ok"}), "application/json")
            else:
                error = {"code": "not_found", "message": f"no route {path}"}
                self._send(404, orjson.dumps({"error": error}), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug(format, *args)

    return Handler


def run(settings: Settings, store_wait: float) -> None:
    """Start one archiver from `settings` and run it until SIGTERM/SIGINT."""
    # Loaded here: pyarrow and boto3 cost every other `metasrv` command a second.
    from metasrv.archive import Archiver, ObjectStore, PausePoint
    from metasrv.kafka import client_config

    archive = settings.wal.archive
    if not archive.enabled:
        raise ConfigError(
            "[wal.archive] enabled is false: set it to true (and the bucket's endpoint and "
            "credentials) to run an archiver"
        )
    host, port = split_addr(settings.http.addr)
    pause = os.environ.get(PAUSE_ENV)
    points = [p.value for p in PausePoint]
    if pause and pause not in points:
        raise ConfigError(f"{PAUSE_ENV} must be one of {points}, got {pause!r}")
    pause_at = PausePoint(pause) if pause else None
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("stopping on %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store = ObjectStore(archive, timeout=5.0)
    try:
        if not wait_for_store(store, store_wait, stop):
            store.close()
            return
        archiver = Archiver(
            settings.wal, store, client_config=client_config(settings.wal), pause_at=pause_at
        )
        server = ThreadingHTTPServer((host, port), _handler(archiver))
    except BaseException:
        store.close()
        raise
    server.daemon_threads = True
    serving = threading.Thread(target=server.serve_forever, name="archiver-http", daemon=True)
    serving.start()
    logger.info(
        "starting archiver",
        extra={
            "addr": settings.http.addr,
            "group": archive.consumer_group,
            "bucket": archive.bucket,
            "prefix": archive.prefix,
        },
    )
    try:
        archiver.run(stop)
    finally:
        server.shutdown()
        server.server_close()
        store.close()
    logger.info("archiver stopped")


def register(app: typer.Typer) -> None:
    """Add `metasrv archive`."""

    @app.command("archive")
    def archive(
        config: Annotated[
            Path,
            typer.Option(
                "-c",
                "--config",
                help="TOML configuration (DESIGN §6: the wal, wal.archive and http sections); "
                "METASRV_* environment variables override it.",
            ),
        ],
        store_wait: Annotated[
            float,
            typer.Option(help="Seconds to wait for the object store to answer at start."),
        ] = 30.0,
        log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    ) -> None:
        """Run one WAL archiver: copy the WAL topics to the object store (DESIGN §8)."""
        configure_logging(log_level)
        try:
            settings = load_settings(config)
            run(settings, store_wait)
        except ConfigError as exc:
            typer.echo(f"metasrv archive: {exc}", err=True)
            raise typer.Exit(code=2) from exc
        except (MetasrvError, OSError) as exc:
            typer.echo(f"metasrv archive: cannot start: {exc}", err=True)
            raise typer.Exit(code=1) from exc
