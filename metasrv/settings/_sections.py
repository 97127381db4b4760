"""Configuration per DESIGN §6: a TOML file, then `METASRV_` environment overrides.

Nested keys use a double underscore in the environment, e.g.
`METASRV_WAL__BROKER_ENDPOINTS='["127.0.0.1:9092"]'` or `METASRV_KV__BACKEND=etcd`.
Durations ("30m") become float seconds and sizes ("512MB") become int bytes.
"""

from __future__ import annotations

import logging
import tomllib
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from metasrv.errors import ConfigError
from metasrv.settings._greptimedb import ALIASES, IGNORED_KEYS, split_wal_section, suggest
from metasrv.settings._locations import check_stats_url
from metasrv.settings._units import parse_duration, parse_size

logger = logging.getLogger(__name__)

Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _both_or_neither(section: _Section, cert: str, key: str) -> Any:
    """A client certificate needs its key and a key its certificate."""
    if (getattr(section, cert) is None) != (getattr(section, key) is None):
        raise ValueError(f"{cert} and {key} go together")
    return section


class KafkaTlsSettings(_Section):
    """GreptimeDB's `[wal.tls]`: present (even empty) means TLS to every broker."""

    server_ca_cert_path: str | None = None
    """PEM CA bundle that signed the brokers' certificates; None: the system's CA store."""
    client_cert_path: str | None = None
    """PEM client certificate (mutual TLS); needs `client_key_path`."""
    client_key_path: str | None = None

    _check_pair = model_validator(mode="after")(
        lambda self: _both_or_neither(self, "client_cert_path", "client_key_path")
    )


class KafkaSaslSettings(_Section):
    """GreptimeDB's `[wal.sasl]`."""

    type: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    username: str = Field(min_length=1)
    password: SecretStr


def _check_endpoint(value: str) -> str:
    """ "" (AWS's own endpoints) or an http(s) URL with a host."""
    if not value:
        return value
    url = urllib.parse.urlsplit(value)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"endpoint must be an http:// or https:// URL with a host, got {value!r}")
    return value


def _check_prefix(value: str) -> str:
    if value.startswith("/"):
        # S3 keys do not start with "/": the object would not be where the key says.
        raise ValueError(f"prefix must not start with '/', got {value!r}")
    return value


class ArchiveSettings(_Section):
    """`[wal.archive]` (DESIGN §6, §8): where archivers copy the WAL before a purge deletes it."""

    enabled: bool = False
    # S3-compatible endpoint URL; "" means AWS's own for `region`.
    endpoint: Annotated[str, AfterValidator(_check_endpoint)] = ""
    # S3 bucket naming: 3-63 lowercase letters, digits, dots and hyphens.
    bucket: str = Field(default="metasrv-wal", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    # Key prefix inside the bucket, e.g. "prod/": {prefix}{topic}/{first}-{last}.parquet.
    prefix: Annotated[str, AfterValidator(_check_prefix)] = ""
    region: str = Field(default="us-east-1", min_length=1)
    # Both empty: the standard AWS credential chain (environment, profile, instance role).
    access_key_id: str = ""
    # Out of repr altogether (SecretStr masks the value; the name alone reads like a leak).
    secret_access_key: SecretStr = Field(default=SecretStr(""), repr=False)
    # The Kafka consumer group the archivers form; pinned while the archive is enabled.
    consumer_group: str = Field(default="metasrv-archive", min_length=1)
    object_max_bytes: Size = Field(default=parse_size("64MB"), gt=0)
    object_max_delay: Duration = Field(default=parse_duration("60s"), gt=0)
    # Objects wholly below every region's replay start are deleted once older than this;
    # "0s" keeps every object.
    retention: Duration = parse_duration("7d")

    @model_validator(mode="after")
    def _credentials_go_together(self) -> ArchiveSettings:
        if bool(self.access_key_id) != bool(self.secret_access_key.get_secret_value()):
            raise ValueError(
                "access_key_id and secret_access_key go together (both empty: the standard "
                "AWS credential chain)"
            )
        return self


class WalSettings(_Section):
    provider: Literal["kafka"] = "kafka"
    broker_endpoints: list[str] = Field(default_factory=lambda: ["127.0.0.1:9092"], min_length=1)
    num_topics: int = Field(default=64, ge=1, le=100_000)
    topic_name_prefix: str = Field(default="greptimedb_wal_topic", pattern=r"^[A-Za-z0-9._-]+$")
    replication_factor: int = Field(default=1, ge=1)
    # Not in DESIGN §6: `min.insync.replicas` of the topics metasrv creates (<= the
    # replication factor); unset: the brokers' default. With acks=all, a write is
    # acknowledged only once this many replicas hold it.
    min_insync_replicas: int | None = Field(default=None, ge=1)
    # GreptimeDB: create the whole pool when this process becomes leader. False: the
    # pool's topics must exist (metasrv never creates one).
    auto_create_topics: bool = True
    # Partitions of each created topic (GreptimeDB); entries live in partition 0 only.
    num_partitions: int = Field(default=1, ge=1)
    selector_type: Literal["round_robin"] = "round_robin"
    create_topic_timeout: Duration = parse_duration("30s")
    connect_timeout: Duration = parse_duration("3s")
    # Kafka topic settings applied when metasrv creates a topic, over metasrv's own
    # `cleanup.policy=delete`, `retention.ms=-1`. Values are strings, as Kafka takes them.
    topic_config: dict[str, str] = Field(default_factory=dict)
    tls: KafkaTlsSettings | None = None
    sasl: KafkaSaslSettings | None = None
    auto_prune_interval: Duration = parse_duration("30m")
    auto_prune_parallelism: int = Field(default=10, ge=1)
    flush_trigger_size: Size = parse_size("512MB")
    flush_wait_timeout: Duration = parse_duration("30s")
    region_stat_ttl: Duration = parse_duration("30s")
    logical_delete: bool = False
    # Not in DESIGN §6: the RFC's size trigger. A topic whose estimated reclaimable bytes
    # exceed this gets a purge before the next interval tick. "0B" disables it.
    size_trigger: Size = parse_size("0B")
    # Not in DESIGN §6: how often region checkpoints are flushed to the kv backend, after
    # how many dirty regions a flush happens early, and how many regions a second the
    # background flushes write at most (0: as fast as the kv takes them).
    checkpoint_interval: Duration = parse_duration("5s")
    checkpoint_batch: int = Field(default=10_000, ge=1)
    checkpoint_rate: int = Field(default=5_000, ge=0)
    # Not in DESIGN §6: how long a DeleteRecords waits on the broker for the partition's
    # followers to reach the new log start. The partition leader moves its own log start
    # at once; a purge then reads it, so a paused or lagging follower costs a purge this
    # long, not the admin request timeout.
    delete_records_wait: Duration = Field(default=parse_duration("2s"), gt=0)
    # Kafka consumer groups whose committed offset on a WAL topic bounds every purge of it
    # (DESIGN §8); see `pinned_groups` for the full set.
    pin_consumer_groups: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    archive: ArchiveSettings = Field(default_factory=ArchiveSettings)

    @property
    def pinned_groups(self) -> tuple[str, ...]:
        """Every consumer group that bounds a purge: `pin_consumer_groups`, and the archive's
        `consumer_group` while the archive is enabled (in that order, each once)."""
        groups = list(self.pin_consumer_groups)
        if self.archive.enabled:
            groups.append(self.archive.consumer_group)
        return tuple(dict.fromkeys(groups))

    @model_validator(mode="after")
    def _pins_named_once(self) -> WalSettings:
        repeated = sorted(
            {g for g in self.pin_consumer_groups if self.pin_consumer_groups.count(g) > 1}
        )
        if repeated:
            raise ValueError(f"pin_consumer_groups names {', '.join(map(repr, repeated))} twice")
        return self

    @model_validator(mode="after")
    def _topic_config_keeps_deletion(self) -> WalSettings:
        policy = self.topic_config.get("cleanup.policy", "delete")
        if policy != "delete":
            # DeleteRecords is refused on compacted topics, and compaction drops WAL entries.
            raise ValueError(f"topic_config cleanup.policy must be 'delete', got {policy!r}")
        if self.logical_delete and not has_finite_retention(self.topic_config):
            # A logical delete only moves the marker; without a finite retention on the
            # topics nothing is ever reclaimed and the WAL grows forever.
            raise ValueError(
                "logical_delete = true needs a finite retention in topic_config "
                '(e.g. topic_config = {"retention.ms" = "604800000"}): metasrv then only moves '
                "the marker and Kafka's retention is what deletes entries"
            )
        self._check_min_insync_replicas()
        return self

    def _check_min_insync_replicas(self) -> None:
        wanted = self.min_insync_replicas
        if wanted is None:
            return
        if wanted > self.replication_factor:
            # Kafka would refuse every acks=all write to such a topic (NOT_ENOUGH_REPLICAS).
            raise ValueError(
                f"min_insync_replicas ({wanted}) must be <= replication_factor "
                f"({self.replication_factor})"
            )
        in_config = self.topic_config.get("min.insync.replicas")
        if in_config is not None and in_config.strip() != str(wanted):
            raise ValueError(
                f"min_insync_replicas = {wanted} conflicts with topic_config "
                f"min.insync.replicas = {in_config!r}: set it in one place"
            )

    @property
    def wanted_min_insync_replicas(self) -> int | None:
        """The `min.insync.replicas` WAL topics are created with, if configured (by
        `min_insync_replicas` or `topic_config`)."""
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas
        raw = self.topic_config.get("min.insync.replicas", "").strip()
        return int(raw) if raw.isdigit() else None

    def topic_creation_config(self) -> dict[str, str]:
        """Kafka settings of a topic metasrv creates."""
        durability = (
            {}
            if self.min_insync_replicas is None
            else {"min.insync.replicas": str(self.min_insync_replicas)}
        )
        return {
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            **durability,
            **self.topic_config,
        }


def has_finite_retention(topic_config: dict[str, str]) -> bool:
    """True when `retention.ms` or `retention.bytes` is set to something other than -1."""
    return any(
        topic_config.get(key, "-1").strip() not in ("-1", "")
        for key in ("retention.ms", "retention.bytes")
    )


class ProcedureSettings(_Section):
    max_retry_times: int = Field(default=12, ge=0)
    retry_delay: Duration = parse_duration("500ms")
    max_running_procedures: int = Field(default=128, ge=1)
    # Finished procedure records stay in the kv backend this long (history keeps them in SQL).
    finished_ttl: Duration = parse_duration("1h")


class HttpSettings(_Section):
    addr: str = "127.0.0.1:4000"
    # How other processes reach this one (421s, the heartbeat's `leader`, /v1/leader);
    # "" means `addr`. GreptimeDB calls it `server_addr`.
    advertise_addr: str = Field(default="", pattern=r"^$|^\S+:\d{1,5}$")
    body_limit: Size = parse_size("16MB")
    # Not in DESIGN §6: limits on what else a client controls (api/serving.py).
    header_limit: Size = Field(default=parse_size("64KB"), ge=1024)  # line + headers; 431
    max_headers: int = Field(default=100, ge=1)  # header fields per request; over it: 431
    url_limit: Size = Field(default=parse_size("8KB"), ge=256)  # request target; over it: 414
    read_timeout: Duration = Field(default=parse_duration("30s"), gt=0)  # whole request; 408


class EtcdTlsSettings(_Section):
    """`[kv.etcd_tls]`: present means TLS to etcd (GreptimeDB's `backend_tls` key names)."""

    ca_cert_path: str = Field(min_length=1)
    """PEM CA bundle that signed etcd's server certificate."""
    cert_path: str | None = None
    """PEM client certificate (etcd `--client-cert-auth`); needs `key_path`."""
    key_path: str | None = None

    _check_pair = model_validator(mode="after")(
        lambda self: _both_or_neither(self, "cert_path", "key_path")
    )


class EtcdAuthSettings(_Section):
    """`[kv.etcd_auth]`: etcd user and password (etcd `auth enable`)."""

    username: str = Field(min_length=1)
    password: SecretStr


class KvSettings(_Section):
    backend: Literal["etcd", "sql"] = "sql"
    etcd_endpoints: list[str] = Field(default_factory=lambda: ["127.0.0.1:2379"], min_length=1)
    etcd_tls: EtcdTlsSettings | None = None
    etcd_auth: EtcdAuthSettings | None = None
    sql_url: str = "sqlite:///metasrv-kv.db"
    key_prefix: str = ""


class HistorySettings(_Section):
    url: str = "sqlite:///metasrv-history.db"
    # Not in DESIGN §6: where every leader writes the region stat history the reconcile job
    # reads (an absolute path or s3://, hdfs:// URL; "" = the default in
    # metasrv/stat_history/_location.py). Files go under cluster=<kv key prefix>/.
    stats_url: Annotated[str, AfterValidator(check_stats_url)] = ""
    # Not in DESIGN §6: WAL events (GET /v1/events: prune attempts, data loss) older than
    # this are deleted by the leader, checked every quarter of it (1s..1h); "0s" keeps
    # them for good.
    events_retention: Duration = parse_duration("7d")


_ROLES = ("datanode", "operator", "viewer")


class AuthSettings(_Section):
    """Per-role bearer tokens. `*_token_files` name files read at load time, one token per
    line (blank lines and `#` comments skipped), e.g. a mounted k8s Secret key; their
    tokens join the role's inline list. `allow_open`: see api/auth.py `check_exposure`."""

    datanode_tokens: list[str] = Field(default_factory=list)
    operator_tokens: list[str] = Field(default_factory=list)
    viewer_tokens: list[str] = Field(default_factory=list)
    datanode_token_files: list[str] = Field(default_factory=list)
    operator_token_files: list[str] = Field(default_factory=list)
    viewer_token_files: list[str] = Field(default_factory=list)
    open_read: bool = False
    allow_open: bool = False

    @model_validator(mode="before")
    @classmethod
    def _read_token_files(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        merged = dict(data)
        for role in _ROLES:
            files = merged.get(f"{role}_token_files") or []
            if not isinstance(files, list):
                continue  # the field's own validation reports it
            tokens = list(merged.get(f"{role}_tokens") or [])
            for name in files:
                tokens.extend(_tokens_in(f"{role}_token_files", str(name)))
            merged[f"{role}_tokens"] = tokens
        return merged


def _tokens_in(setting: str, path: str) -> list[str]:
    """The tokens of one token file; a file that is missing, unreadable or empty is an
    error naming the setting (a Secret that failed to mount must not open a role)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{setting}: cannot read {path}: {exc}") from exc
    tokens = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not tokens:
        raise ValueError(f"{setting}: {path} holds no token")
    return tokens


class ElectionSettings(_Section):
    lease_secs: int = Field(default=5, ge=1)
    node_name: str = ""


class ReconcileSettings(_Section):
    """Not in DESIGN §6: the Spark reconcile job (`metasrv reconcile`) and the stat history
    the leader records for it (metasrv/stat_history/; its location is
    `[history] stats_url`)."""

    spark_master: str = "local[2]"
    driver_memory: str = Field(default="4g", pattern=r"^\d+[kmgt]?$")
    stat_history_interval: Duration = parse_duration("1m")  # "0s": the leader records none
    stat_history_retention: Duration = parse_duration("7d")
    stale_after: Duration = parse_duration("15m")
    history_window: Duration = parse_duration("24h")
    skew_tolerance: float = Field(default=0.25, ge=0)
    out_dir: str = "reconcile-out"
    sql_findings_limit: int = Field(default=100_000, ge=0)
    keep_runs: int = Field(default=50, ge=1)
    metasrv_url: str = ""  # "" means http://{http.addr}
    operator_token: str = ""  # "" means the first of auth.operator_tokens


MAX_TREND_SAMPLES = 10_000
"""Most samples `[dashboard]` may keep per topic (`window / sample_interval`)."""


class DashboardSettings(_Section):
    """Not in DESIGN §6: the WAL trend the dashboard plots. Every `sample_interval` the
    leader records each topic's retained WAL (entries and estimated bytes) in memory and
    keeps the last `window` of it (procedures/wal_purge/_trend.py)."""

    sample_interval: Duration = parse_duration("15s")  # "0s": no trend is kept
    window: Duration = Field(default=parse_duration("1h"), gt=0)

    @model_validator(mode="after")
    def _bounded(self) -> DashboardSettings:
        if self.sample_interval > 0 and self.window / self.sample_interval > MAX_TREND_SAMPLES:
            raise ValueError(
                f"window / sample_interval is over {MAX_TREND_SAMPLES} samples per topic"
            )
        return self


class Settings(BaseSettings):
    """The whole configuration; build it with `load_settings`, never at import time."""

    model_config = SettingsConfigDict(
        env_prefix="METASRV_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    wal: WalSettings = Field(default_factory=WalSettings)
    procedure: ProcedureSettings = Field(default_factory=ProcedureSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    kv: KvSettings = Field(default_factory=KvSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    election: ElectionSettings = Field(default_factory=ElectionSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment wins over the file (passed as init kwargs).
        return (env_settings, init_settings)

    @property
    def node_name(self) -> str:
        """This process's name in elections; defaults to its HTTP address."""
        return self.election.node_name or self.http.addr


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read the TOML file (if any), apply `METASRV_*` env overrides, validate.

    `overrides` are section dicts (e.g. `kv={"backend": "etcd"}`) merged over the file;
    tests and the demo use them. Raises `ConfigError` naming the bad field.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    for section, values in overrides.items():
        merged = dict(data.get(section, {}))
        merged.update(values)
        data[section] = merged
    ignored: list[str] = []
    if isinstance(data.get("wal"), dict):
        data["wal"], ignored = split_wal_section(data["wal"])
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_describe(exc)}") from exc
    if ignored:
        logger.warning(
            "ignoring GreptimeDB [wal] keys metasrv does not use (datanode-side or not "
            "implemented): %s",
            ", ".join(ignored),
            extra={"ignored_keys": ignored},
        )
    return settings


def _describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        hint = ""
        if err["type"] == "extra_forbidden":
            hint = suggest(str(err["loc"][-1]), _known_keys(err["loc"][:-1]))
        problems.append(f"{where}: {err['msg']}{hint}")
    return "; ".join(problems)


def _known_keys(path: tuple[int | str, ...]) -> list[str]:
    """Field names of the section at `path` (for "did you mean")."""
    model: type[BaseModel] = Settings
    for part in path:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        nested = [
            a
            for a in (getattr(annotation, "__args__", None) or (annotation,))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not nested:
            return []
        model = nested[0]
    known = list(model.model_fields)
    if model is WalSettings:
        known += [*IGNORED_KEYS, *ALIASES]
    return known
