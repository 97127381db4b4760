"""`metasrv stack up --s3`: S3Proxy from Maven Central, its bucket, status and down; and what
its filesystem backend does with conditional writes and checksums (docs/archive.md)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from cli import app
from metasrv.errors import ServiceError
from toolbox.simulator import free_port
from toolbox.stack import (
    S3_BUCKET,
    S3PROXY_VERSION,
    S3Endpoint,
    StackConfig,
    download_verified,
    pid_alive,
    s3_client,
    s3_endpoint_of,
    start_service,
    status,
    stop_service,
)


def _code(exc: ClientError) -> tuple[int, str]:
    meta = exc.response.get("ResponseMetadata", {})
    return int(meta.get("HTTPStatusCode", 0)), str(exc.response.get("Error", {}).get("Code"))


def test_up_s3_prints_the_four_s3_lines_and_the_bucket_exists(s3_endpoint: S3Endpoint) -> None:
    cfg = StackConfig.from_env()
    result = CliRunner().invoke(app, ["stack", "up", "--s3", "--state-dir", str(cfg.state_dir)])
    assert result.exit_code == 0, result.output
    pairs = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert pairs["S3_ENDPOINT"] == f"http://127.0.0.1:{cfg.s3_port}"
    assert pairs["S3_BUCKET"] == S3_BUCKET
    assert pairs["S3_ACCESS_KEY_ID"] and pairs["S3_SECRET_ACCESS_KEY"]
    buckets = s3_client(pairs["S3_ENDPOINT"]).list_buckets()["Buckets"]
    assert S3_BUCKET in {b.get("Name") for b in buckets}


def test_status_s3_lists_the_server(s3_endpoint: S3Endpoint) -> None:
    cfg = StackConfig.from_env()
    result = CliRunner().invoke(app, ["stack", "status", "--s3", "--state-dir", str(cfg.state_dir)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("s3 "))
    assert row.rstrip().endswith("healthy") and "UNHEALTHY" not in row
    assert f"S3_ENDPOINT=http://127.0.0.1:{cfg.s3_port}" in result.output.splitlines()


def test_status_cluster_s3_reads_the_port_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("METASRV_STACK_S3_PORT", str(port))
    result = CliRunner().invoke(
        app, ["stack", "status", "--cluster", "--s3", "--state-dir", str(tmp_path)]
    )
    assert result.exit_code == 1  # nothing runs on the spare port
    row = next(line for line in result.output.splitlines() if line.startswith("s3 "))
    assert f"http://127.0.0.1:{port}" in row and "not running" in row and "UNHEALTHY" in row
    assert f"S3_ENDPOINT=http://127.0.0.1:{port}" in result.output.splitlines()
    assert f"S3_BUCKET={S3_BUCKET}" in result.output.splitlines()


def test_s3_on_a_spare_port_starts_with_its_bucket_stops_and_starts_again(
    s3_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    shared = StackConfig.from_env()
    jar = shared.state_dir / "s3" / f"s3proxy-{S3PROXY_VERSION}.jar"
    if not jar.exists():
        pytest.skip("the running S3 server is not this stack's (no jar to share)")
    cfg = StackConfig.from_env(state_dir=tmp_path / "stack", s3_port=free_port())
    (cfg.state_dir / "s3").mkdir(parents=True)
    (cfg.state_dir / "s3" / jar.name).symlink_to(jar)
    try:
        first = start_service(cfg, "s3")
        assert first.healthy and first.pid is not None
        client = s3_client(s3_endpoint_of(cfg).endpoint)
        client.put_object(Bucket=S3_BUCKET, Key="a/b", Body=b"kept on disk")
        assert (cfg.state_dir / "s3" / "data" / S3_BUCKET / "a" / "b").read_bytes() == (
            b"kept on disk"
        )
        assert stop_service(cfg, "s3") is True
        assert not pid_alive(first.pid)
        assert not any(st.healthy for st in status(cfg, s3=True) if st.name == "s3")
        again = start_service(cfg, "s3")
        assert again.healthy and again.pid not in (None, first.pid)
        body = client.get_object(Bucket=S3_BUCKET, Key="a/b")["Body"].read()
        assert body == b"kept on disk"
    finally:
        stop_service(cfg, "s3")


def test_download_keeps_a_file_only_when_its_sha1_matches(tmp_path: Path) -> None:
    source = tmp_path / "artifact.jar"
    source.write_bytes(b"jar bytes" * 1000)
    good = hashlib.sha1(source.read_bytes(), usedforsecurity=False).hexdigest()
    target = tmp_path / "installed.jar"

    (tmp_path / "artifact.jar.sha1").write_text("0" * 40 + "\n")
    with pytest.raises(ServiceError, match="SHA-1"):
        download_verified(source.as_uri(), target)
    assert not target.exists() and not list(tmp_path.glob("*.part"))

    (tmp_path / "artifact.jar.sha1").write_text(good + "\n")
    download_verified(source.as_uri(), target)
    assert target.read_bytes() == source.read_bytes()


# What docs/archive.md ("The object store") says S3Proxy's filesystem backend does; if an
# upgrade changes one of these, the document and metasrv.archive's store must follow.


def test_if_none_match_is_ignored_and_overwrites(s3_endpoint: S3Endpoint, s3_prefix: str) -> None:
    client = s3_client(s3_endpoint.endpoint)
    key = f"{s3_prefix}conditional"
    client.put_object(Bucket=s3_endpoint.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    client.put_object(Bucket=s3_endpoint.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    body = client.get_object(Bucket=s3_endpoint.bucket, Key=key)["Body"].read()
    client.delete_object(Bucket=s3_endpoint.bucket, Key=key)
    assert body == b"second"


def test_content_md5_is_verified(s3_endpoint: S3Endpoint, s3_prefix: str) -> None:
    client = s3_client(s3_endpoint.endpoint)
    key = f"{s3_prefix}md5"
    wrong = base64.b64encode(hashlib.md5(b"other", usedforsecurity=False).digest()).decode()
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=s3_endpoint.bucket, Key=key, Body=b"data", ContentMD5=wrong)
    assert _code(info.value) == (400, "BadDigest")
    with pytest.raises(ClientError) as missing:
        client.head_object(Bucket=s3_endpoint.bucket, Key=key)
    assert _code(missing.value)[0] == 404


def test_flexible_checksums_are_not_implemented(s3_endpoint: S3Endpoint, s3_prefix: str) -> None:
    client = s3_client(s3_endpoint.endpoint)
    sha = base64.b64encode(hashlib.sha256(b"data").digest()).decode()
    with pytest.raises(ClientError) as info:
        client.put_object(
            Bucket=s3_endpoint.bucket, Key=f"{s3_prefix}sha", Body=b"data", ChecksumSHA256=sha
        )
    assert _code(info.value) == (501, "NotImplemented")
