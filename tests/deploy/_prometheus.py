"""A real Prometheus server (Debian's `prometheus` package) for the monitoring tests.

`PrometheusServer.start` writes a config scraping the given targets every second, loads rule
files, starts `prometheus` on a free loopback port with its TSDB in a temporary directory, and
waits until it is ready. Queries go through its HTTP API (`/api/v1/...`).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

import httpx
import pytest
import yaml

from tests._wait import wait_until
from toolbox.simulator import free_port

T = TypeVar("T")

SCRAPE_INTERVAL = "1s"
"""Scrape and rule evaluation interval of the test servers."""
RATE_INTERVAL = "4s"
"""What Grafana's `$__rate_interval` is at this scrape interval (4 x scrape, the least)."""


def system_binary(name: str) -> str:
    """Path of `prometheus` or `promtool`; fails the test (never skips) when absent."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} not found on PATH: the monitoring tests need Debian's prometheus package; "
            "install it with `deploy/bootstrap.sh --test` (or `make bootstrap-test`)",
            pytrace=False,
        )
    return found


class PrometheusServer:
    """One `prometheus` child process and a client of its HTTP API."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: TextIO, log_path: Path):
        self.url = url
        self.proc = proc
        self._log = log
        self.log_path = log_path
        self.http = httpx.Client(base_url=url, timeout=10.0)

    @classmethod
    def start(
        cls,
        workdir: Path,
        *,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        bearer_token: str | None = None,
        job: str = "metasrv",
        ready_timeout: float = 30.0,
    ) -> PrometheusServer:
        """Start a server scraping `targets` (host:port, `/metrics`) as `job`."""
        workdir.mkdir(parents=True, exist_ok=True)
        scrape: dict[str, Any] = {
            "job_name": job,
            "metrics_path": "/metrics",
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "static_configs": [{"targets": list(targets)}],
        }
        if bearer_token is not None:
            scrape["authorization"] = {"type": "Bearer", "credentials": bearer_token}
        config = {
            "global": {
                "scrape_interval": SCRAPE_INTERVAL,
                "evaluation_interval": SCRAPE_INTERVAL,
            },
            "rule_files": [str(p.resolve()) for p in rule_files],
            "scrape_configs": [scrape],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        log_path = workdir / "prometheus.log"
        log = log_path.open("w")
        proc = subprocess.Popen(
            [
                system_binary("prometheus"),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        server = cls(f"http://127.0.0.1:{port}", proc, log, log_path)
        try:
            wait_until(
                lambda: server._ready() or None,
                "prometheus ready",
                timeout=ready_timeout,
                interval=0.2,
            )
        except BaseException:
            server.stop()
            raise
        return server

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            return self.http.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_for_targets(self, timeout: float = 30.0) -> None:
        """Wait until every target answered a scrape (Prometheus hands new targets to its
        scrapers only every 5 s)."""

        def up() -> bool:
            targets = self.api("targets")["activeTargets"]
            return bool(targets) and all(t["health"] == "up" for t in targets)

        wait_until(up, "every target scraped", timeout=timeout, interval=0.2)

    def tail(self, lines: int = 30) -> str:
        """The end of the server's log."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s (idempotent)."""
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    # --- HTTP API ---------------------------------------------------------------------------

    def api(self, path: str, **params: Any) -> Any:
        """`GET /api/v1/{path}`; the `data` of a successful answer."""
        response = self.http.get(f"/api/v1/{path}", params=params)
        body = response.json()
        assert response.status_code == 200 and body.get("status") == "success", (
            f"GET /api/v1/{path} {params}: {response.status_code} {body}"
        )
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (vector samples: `metric`, `value`)."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
        """A range query's result (matrix series: `metric`, `values`)."""
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        assert data["resultType"] == "matrix", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result
