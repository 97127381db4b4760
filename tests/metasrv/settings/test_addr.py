"""`host:port` as settings, peers and etcd endpoints write it."""

from __future__ import annotations

import pytest

from metasrv.settings import WILDCARD_HOSTS, split_host_port


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [
        ("127.0.0.1:4000", ("127.0.0.1", 4000)),
        ("metasrv-1:4000", ("metasrv-1", 4000)),
        ("[::1]:2379", ("[::1]", 2379)),
        (":4000", ("", 4000)),
        ("http://etcd-0:2379/", ("etcd-0", 2379)),
        ("metasrv-1", None),
        ("metasrv-1:", None),
        ("metasrv-1:http", None),
    ],
)
def test_split_host_port(addr: str, parsed: tuple[str, int] | None) -> None:
    assert split_host_port(addr) == parsed


def test_a_wildcard_host_binds_every_interface() -> None:
    hosts = [split_host_port(a) for a in ("0.0.0.0:1", "[::]:1", ":1", "localhost:1")]
    assert [h is not None and h[0] in WILDCARD_HOSTS for h in hosts] == [True, True, True, False]
