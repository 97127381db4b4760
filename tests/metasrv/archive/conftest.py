"""Fixtures of the archive tests: a private S3-compatible server a test may stop or signal."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolbox.simulator import free_port
from toolbox.stack import (
    S3PROXY_VERSION,
    S3Endpoint,
    StackConfig,
    service_pid,
    start_service,
    stop_service,
)


@pytest.fixture
def own_server(s3_endpoint: S3Endpoint, tmp_path: Path) -> Iterator[StackConfig]:
    """A private S3Proxy on a spare port (this test signals it), sharing the stack's jar."""
    jar = StackConfig.from_env().state_dir / "s3" / f"s3proxy-{S3PROXY_VERSION}.jar"
    if not jar.exists():
        pytest.skip("the running S3 server is not this stack's (no jar to share)")
    cfg = StackConfig.from_env(state_dir=tmp_path / "stack", s3_port=free_port())
    (cfg.state_dir / "s3").mkdir(parents=True)
    (cfg.state_dir / "s3" / jar.name).symlink_to(jar)
    start_service(cfg, "s3")
    try:
        yield cfg
    finally:
        pid = service_pid(cfg, "s3")
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        stop_service(cfg, "s3")
