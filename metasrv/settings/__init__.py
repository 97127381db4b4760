"""Configuration: the TOML sections and their validation, size and duration units, `host:port`
addresses, and the GreptimeDB `[wal]` section aliases.
"""

from metasrv.settings._addr import WILDCARD_HOSTS, split_host_port
from metasrv.settings._greptimedb import IGNORED_KEYS
from metasrv.settings._locations import check_stats_url, is_url
from metasrv.settings._sections import (
    ArchiveSettings,
    AuthSettings,
    HttpSettings,
    KvSettings,
    ProcedureSettings,
    Settings,
    WalSettings,
    load_settings,
)
from metasrv.settings._units import parse_duration

__all__ = [
    "IGNORED_KEYS",
    "WILDCARD_HOSTS",
    "ArchiveSettings",
    "AuthSettings",
    "HttpSettings",
    "KvSettings",
    "ProcedureSettings",
    "Settings",
    "WalSettings",
    "check_stats_url",
    "is_url",
    "load_settings",
    "parse_duration",
    "split_host_port",
]
