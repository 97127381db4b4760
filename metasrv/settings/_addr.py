"""Network addresses as settings and peers write them: `host:port`.

`http.addr`, `http.advertise_addr`, a leader's address in a 421 and an etcd endpoint are
all `host:port` (`[v6]:port` for IPv6, `:port` for every interface); a wildcard host
(`WILDCARD_HOSTS`) binds every interface and is not an address anyone can reach.
"""

from __future__ import annotations

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
"""Hosts that bind every interface: a peer must be given another name for this host."""


def split_host_port(addr: str) -> tuple[str, int] | None:
    """`host:port` (also behind `scheme://`, before a trailing `/`) -> (host as written,
    IPv6 brackets kept; port); None when no numeric port ends it."""
    rest = addr.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host, int(port)
