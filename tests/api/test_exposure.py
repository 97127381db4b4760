"""Closed by default: `metasrv start` on a non-loopback address refuses open roles unless
`auth.allow_open`; tokens from files; open roles are logged as warnings."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import httpx
import pytest

from api.auth import check_exposure, is_loopback, open_roles
from metasrv.errors import ConfigError
from metasrv.settings import AuthSettings, load_settings
from toolbox.simulator import free_port, metasrv_argv


def test_every_empty_role_and_open_read_count_as_open() -> None:
    assert open_roles(AuthSettings()) == [
        "datanode (no datanode_tokens)",
        "operator (no operator_tokens)",
        "viewer (no viewer_tokens)",
    ]
    closed = AuthSettings(datanode_tokens=["d"], operator_tokens=["o"], viewer_tokens=["v"])
    assert open_roles(closed) == []
    assert open_roles(closed.model_copy(update={"open_read": True})) == [
        "viewer (open_read = true)"
    ]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
     ("metasrv.example", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_open_role_on_a_public_bind_is_refused_naming_the_fixes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth = AuthSettings(datanode_tokens=["d"], viewer_tokens=["v"])
    with pytest.raises(ConfigError) as refused:
        check_exposure(auth, "0.0.0.0")
    message = str(refused.value)
    assert "operator (no operator_tokens)" in message and "allow_open = true" in message
    assert "datanode" not in message
    with caplog.at_level(logging.WARNING, logger="api.auth"):
        check_exposure(auth.model_copy(update={"allow_open": True}), "0.0.0.0")
        check_exposure(auth, "127.0.0.1")  # loopback: allowed, still warned
    warned = [r.getMessage() for r in caplog.records if r.name == "api.auth"]
    assert warned == ["endpoints open without a token: operator (no operator_tokens)"] * 2


def test_a_closed_configuration_warns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    auth = AuthSettings(datanode_tokens=["d"], operator_tokens=["o"], viewer_tokens=["v"])
    with caplog.at_level(logging.WARNING, logger="api.auth"):
        check_exposure(auth, "0.0.0.0")
    assert [r for r in caplog.records if r.name == "api.auth"] == []


def test_tokens_from_files_join_the_inline_ones(tmp_path: Path) -> None:
    (tmp_path / "op").write_text("# rotated 2025-01\nnew-token\n\n  old-token  \n")
    (tmp_path / "dn").write_text("dn-token")  # a k8s Secret key: no trailing newline
    settings = load_settings(
        auth={
            "operator_tokens": ["inline"],
            "operator_token_files": [str(tmp_path / "op")],
            "datanode_token_files": [str(tmp_path / "dn")],
        }
    )
    assert settings.auth.operator_tokens == ["inline", "new-token", "old-token"]
    assert settings.auth.datanode_tokens == ["dn-token"]
    assert settings.auth.viewer_tokens == []


def test_tokens_from_files_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "viewer").write_text("v1\n")
    monkeypatch.setenv("METASRV_AUTH__VIEWER_TOKEN_FILES", f'["{tmp_path / "viewer"}"]')
    assert load_settings().auth.viewer_tokens == ["v1"]


@pytest.mark.parametrize("content", [None, "", "# only a comment\n\n"])
def test_a_missing_or_empty_token_file_is_a_config_error(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "operator"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match="operator_token_files") as refused:
        load_settings(auth={"operator_token_files": [str(path)]})
    assert str(path) in str(refused.value)


def test_metasrv_start_on_a_public_address_with_open_roles_exits_2(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "metasrv.toml"
    config.write_text(
        f'[http]\naddr = "0.0.0.0:{port}"\n'
        f'[kv]\nsql_url = "sqlite:///{tmp_path / "kv.db"}"\n'
        f'[history]\nurl = "sqlite:///{tmp_path / "history.db"}"\n'
        '[auth]\ndatanode_tokens = ["d"]\n'
    )
    done = subprocess.run(
        metasrv_argv("start", "-c", str(config)), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "refusing to serve on 0.0.0.0" in done.stderr
    assert "operator (no operator_tokens)" in done.stderr
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
    assert not (tmp_path / "kv.db").exists()  # refused before touching any store
