"""GreptimeDB `[wal]` keys: the ones metasrv accepts and ignores, aliases, "did you mean".

An operator can paste a GreptimeDB metasrv or standalone `[wal]` section as is. Keys
metasrv implements keep GreptimeDB's meaning (see `WalSettings`); the keys below belong
to the datanode (or the raft-engine provider) or to GreptimeDB features metasrv does not
have, so they are accepted and named in one start-up warning. Sources: GreptimeDB's
`src/common/wal/src/config/kafka/{common,metasrv,datanode}.rs` and
`src/common/wal/src/config/raft_engine.rs`, `config/*.example.toml`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from metasrv.errors import ConfigError

IGNORED_KEYS: Mapping[str, str] = {
    # datanode-side Kafka client keys
    "max_batch_bytes": "datanode producer batch size",
    "max_batch_size": "datanode producer batch size (old name of max_batch_bytes)",
    "consumer_wait_timeout": "datanode consumer wait",
    "create_index": "datanode WAL index",
    "dump_index_interval": "datanode WAL index",
    "overwrite_entry_start_id": "datanode replay",
    "topic_latest_offset_fetch_interval": "datanode offset polling",
    "backoff_init": "datanode client backoff",
    "backoff_max": "datanode client backoff",
    "backoff_base": "datanode client backoff",
    "backoff_deadline": "datanode client backoff",
    # GreptimeDB's request deadline: metasrv's admin requests keep their own 10 s deadline.
    "timeout": "kafka request timeout (metasrv uses its own)",
    # GreptimeDB metasrv features metasrv does not have
    "checkpoint_trigger_size": "GreptimeDB checkpoint trigger",
    "region_flush_trigger_interval": "GreptimeDB flush trigger cadence",
    "periodic_checkpoint_persist_interval": "GreptimeDB checkpoint persistence",
    # raft-engine provider keys (standalone example)
    "dir": "raft-engine WAL",
    "file_size": "raft-engine WAL",
    "purge_threshold": "raft-engine WAL",
    "purge_interval": "raft-engine WAL",
    "read_batch_size": "raft-engine WAL",
    "sync_write": "raft-engine WAL",
    "enable_log_recycle": "raft-engine WAL",
    "prefill_log_files": "raft-engine WAL",
    "sync_period": "raft-engine WAL",
    "recovery_parallelism": "raft-engine WAL",
}
"""GreptimeDB `[wal]` keys metasrv accepts and ignores, with what they configure."""

ALIASES: Mapping[str, str] = {"auto_prune_logical_delete": "logical_delete"}
"""GreptimeDB's name -> metasrv's name, same meaning."""


def split_wal_section(section: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The `[wal]` table without ignored keys and with aliases renamed, plus the ignored keys.

    Raises `ConfigError` when a key and its alias are both given with different values.
    """
    kept: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in section.items():
        if key in IGNORED_KEYS:
            ignored.append(key)
            continue
        name = ALIASES.get(key, key)
        if name in kept and kept[name] != value:
            raise ConfigError(
                f"invalid configuration: wal.{key} and wal.{name} are the same setting "
                f"with different values ({value!r} vs {kept[name]!r})"
            )
        kept[name] = value
    return kept, sorted(ignored)


def suggest(key: str, known: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest known key, or ""."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""
