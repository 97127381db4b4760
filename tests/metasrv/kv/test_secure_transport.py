"""TLS and SASL to Kafka, TLS to etcd, against real services started for this module.

The module starts its own single-node Kafka (PLAINTEXT for set-up, SSL with client
certificates, SASL_SSL with PLAIN / SCRAM users made at format time) and its own etcd
(client TLS with required client certificates), with certificates generated now by
`toolbox.stack`'s throw-away CA. The shared test stack stays plain-text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from metasrv.election import EtcdElection
from metasrv.errors import KafkaRejected, KvUnavailable
from metasrv.kafka import KafkaAdmin, client_config
from metasrv.kv import EtcdKv, EtcdSecurity
from metasrv.settings import Settings, WalSettings, load_settings
from metasrv.wire import MetasrvClient
from tests._wait import eventually, wait_until
from tests.api._live import DATANODE_TOKEN, OPERATOR_TOKEN, live_settings, serve
from toolbox.stack import SASL_USERS, Pki, StackConfig, make_pki, start_service, stop_service

# Ports of this module's own services: 8 from METASRV_TEST_SECURE_PORT_BASE on.
_BASE = int(os.environ.get("METASRV_TEST_SECURE_PORT_BASE", "19110"))
USER, PASSWORD = next(iter(SASL_USERS.items()))


class SecureStack:
    """This module's Kafka and etcd, and the client settings that reach them."""

    def __init__(self, cfg: StackConfig, pki: Pki) -> None:
        self.cfg = cfg
        self.pki = pki
        self.plain = f"127.0.0.1:{cfg.kafka_port}"
        self.ssl = f"127.0.0.1:{cfg.kafka_ssl_port}"
        self.sasl_ssl = f"127.0.0.1:{cfg.kafka_sasl_ssl_port}"
        self.etcd = f"127.0.0.1:{cfg.etcd_port}"

    def tls(self, *, client_cert: bool) -> dict[str, str]:
        """A `[wal.tls]` table."""
        tls = {"server_ca_cert_path": str(self.pki.ca_cert)}
        if client_cert:
            tls |= {
                "client_cert_path": str(self.pki.client_cert),
                "client_key_path": str(self.pki.client_key),
            }
        return tls

    def wal(self, mechanism: str | None, password: str = PASSWORD) -> dict[str, Any]:
        """A `[wal]` table: SSL with a client certificate, or SASL_SSL with `mechanism`."""
        if mechanism is None:
            return {"broker_endpoints": [self.ssl], "tls": self.tls(client_cert=True)}
        return {
            "broker_endpoints": [self.sasl_ssl],
            "tls": self.tls(client_cert=False),
            "sasl": {"type": mechanism, "username": USER, "password": password},
        }

    def etcd_tls(self) -> dict[str, str]:
        """A `[kv.etcd_tls]` table."""
        return {
            "ca_cert_path": str(self.pki.ca_cert),
            "cert_path": str(self.pki.client_cert),
            "key_path": str(self.pki.client_key),
        }


@pytest.fixture(scope="module")
def secure(local_stack: object) -> Iterator[SecureStack]:
    shared = StackConfig.from_env()
    # Beside the shared stack, not under pytest's temp root: sessions of other users of the
    # same account prune that root while a long session still runs.
    state = shared.state_dir / f"secure-{uuid.uuid4().hex[:8]}"
    state.mkdir(parents=True)
    cfg = replace(
        shared,
        state_dir=state,
        kafka_port=_BASE,
        kafka_controller_port=_BASE + 1,
        kafka_ssl_port=_BASE + 2,
        kafka_sasl_ssl_port=_BASE + 3,
        etcd_port=_BASE + 4,
        etcd_peer_port=_BASE + 5,
        etcd_tls=True,
    )
    # The Kafka jars of the shared stack (already downloaded by `local_stack`).
    (state / "kafka").mkdir()
    (state / "kafka" / "libs").symlink_to(shared.state_dir / "kafka" / "libs")
    pki = make_pki(cfg.pki_dir)
    try:
        start_service(cfg, "etcd")
        start_service(cfg, "kafka")
        yield SecureStack(cfg, pki)
    finally:
        stop_service(cfg, "kafka")
        stop_service(cfg, "etcd")
        shutil.rmtree(state, ignore_errors=True)


ETCD_ROOT_PASSWORD = "etcd-root-secret"


@pytest.fixture(scope="module")
def auth_etcd(local_stack: object) -> Iterator[str]:
    """A plain-text etcd with authentication on (user `root`), its tokens living 2 s."""
    state = StackConfig.from_env().state_dir / f"auth-etcd-{uuid.uuid4().hex[:8]}"
    state.mkdir(parents=True)
    port, peer = _BASE + 6, _BASE + 7
    endpoint = f"127.0.0.1:{port}"
    log = open(state / "etcd.log", "wb")  # noqa: SIM115  # closed after the process ends
    proc = subprocess.Popen(
        [
            "etcd",
            "--data-dir", str(state / "data"),
            "--listen-client-urls", f"http://{endpoint}",
            "--advertise-client-urls", f"http://{endpoint}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer}",
            "--auth-token-ttl", "2",
            "--log-level", "warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        ctl = ["etcdctl", f"--endpoints={endpoint}", "--dial-timeout=2s"]
        wait_until(
            lambda: (
                subprocess.run([*ctl, "endpoint", "health"], capture_output=True).returncode == 0
            ),
            "the auth etcd healthy",
            interval=0.2,
        )
        for cmd in (
            ["user", "add", f"root:{ETCD_ROOT_PASSWORD}", "--interactive=false"],
            ["user", "grant-role", "root", "root"],
            ["auth", "enable"],
        ):
            subprocess.run([*ctl, *cmd], check=True, capture_output=True)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(state, ignore_errors=True)


def _auth_kv(endpoint: str, password: str) -> EtcdKv:
    auth = {"username": "root", "password": password}
    cfg = load_settings(None, kv={"etcd_auth": auth}).kv
    return EtcdKv([endpoint], f"{uuid.uuid4().hex[:8]}/", security=EtcdSecurity.from_settings(cfg))


def test_etcd_user_password_kv_and_expired_token(auth_etcd: str) -> None:
    kv = _auth_kv(auth_etcd, ETCD_ROOT_PASSWORD)
    try:
        kv.put("k", b"v")
        time.sleep(3)  # the behaviour under test: idle past etcd's 2 s token TTL
        try:
            got = kv.get("k")
        except KvUnavailable as exc:
            # The expired token is dropped; the next request authenticates again.
            assert "UNAUTHENTICATED" in str(exc)
            got = kv.get("k")
        assert got is not None and got.value == b"v"
    finally:
        kv.close()
    anonymous = EtcdKv([auth_etcd], timeout=2.0)
    try:
        with pytest.raises(KvUnavailable):
            anonymous.get("k")
    finally:
        anonymous.close()


def test_etcd_wrong_password_names_the_setting(auth_etcd: str) -> None:
    kv = _auth_kv(auth_etcd, "not-the-password")
    try:
        with pytest.raises(KvUnavailable, match=r"kv\.etcd_auth"):
            kv.get("k")
    finally:
        kv.close()


async def test_election_campaigns_and_keeps_its_lease_with_a_password(auth_etcd: str) -> None:
    kv = _auth_kv(auth_etcd, ETCD_ROOT_PASSWORD)
    election = EtcdElection(kv, node_name="n", addr="127.0.0.1:1", lease_secs=2)
    try:
        await election.start()
        await eventually(lambda: election.is_leader, "elected over an authenticated etcd")
        first = election.lease_deadline

        def leading_renewed() -> bool:
            assert election.is_leader
            return election.lease_deadline >= first + 4.5

        # Keepalives over two token lifetimes (2 s): the leader at every poll.
        await eventually(leading_renewed, "4.5 s of renewals", timeout=15)
    finally:
        await election.stop()
        kv.close()


def _produce(wal: WalSettings, topic: str, count: int) -> None:
    producer = Producer(
        {"bootstrap.servers": ",".join(wal.broker_endpoints), "acks": "all", **client_config(wal)}
    )
    for i in range(count):
        producer.produce(topic, value=bytes([i % 256]) * 64, partition=0)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("mechanism", [None, "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_admin_creates_writes_and_deletes_over_tls_and_sasl(
    secure: SecureStack, mechanism: str | None
) -> None:
    wal = load_settings(
        None, wal={**secure.wal(mechanism), "topic_config": {"segment.bytes": "1048576"}}
    ).wal
    admin = KafkaAdmin.from_settings(wal)
    topic = f"t{uuid.uuid4().hex[:8]}"
    try:
        assert admin.ensure_topics([topic], config=wal.topic_creation_config()) == [topic]
        _produce(wal, topic, 10)
        assert admin.offsets([topic])[topic].high_watermark == 10
        assert admin.delete_records({topic: 4}) == {topic: 4}
        assert admin.topic_configs([topic])[topic]["segment.bytes"] == "1048576"
    finally:
        admin.delete_topics([topic])
        admin.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_wrong_password_names_the_setting(secure: SecureStack, mechanism: str) -> None:
    wal = load_settings(None, wal=secure.wal(mechanism, password="not-the-password")).wal
    admin = KafkaAdmin.from_settings(wal, request_timeout=5.0)
    with pytest.raises(KafkaRejected, match=r"wal\.sasl"):
        admin.ping()


def test_plaintext_client_on_tls_listener_fails(secure: SecureStack) -> None:
    wal = load_settings(
        None, wal={"broker_endpoints": [secure.ssl], "tls": secure.tls(client_cert=False)}
    ).wal
    # No client certificate on a listener that requires one.
    admin = KafkaAdmin.from_settings(wal, request_timeout=5.0)
    with pytest.raises(KafkaRejected, match=r"wal\.tls"):
        admin.ping()


def test_etcd_over_tls(secure: SecureStack) -> None:
    kv = EtcdKv(
        [secure.etcd],
        f"{uuid.uuid4().hex[:8]}/",
        security=EtcdSecurity.from_settings(
            load_settings(None, kv={"etcd_tls": secure.etcd_tls()}).kv
        ),
    )
    try:
        kv.put("k", b"v")
        got = kv.get("k")
        assert got is not None and got.value == b"v"
    finally:
        kv.close()
    plain = EtcdKv([secure.etcd], timeout=2.0)
    try:
        with pytest.raises(KvUnavailable):
            plain.get("k")
    finally:
        plain.close()


def _secure_settings(secure: SecureStack, workdir: Path) -> Settings:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    base = live_settings(prefix, secure.sasl_ssl, secure.etcd, workdir, num_topics=2)
    data = base.model_dump(mode="json")
    data["wal"] |= secure.wal("SCRAM-SHA-512") | {"topic_config": {"retention.ms": "86400000"}}
    data["kv"]["etcd_tls"] = secure.etcd_tls()
    for section in ("wal", "kv", "auth"):
        data[section] = {k: v for k, v in data[section].items() if v is not None}
    return load_settings(None, **data)


def test_heartbeat_and_purge_over_sasl_ssl_and_etcd_tls(
    secure: SecureStack, tmp_path: Path
) -> None:
    settings = _secure_settings(secure, tmp_path)
    wal = settings.wal
    admin = KafkaAdmin.from_settings(wal)
    pool = [f"{wal.topic_name_prefix}_{n}" for n in range(wal.num_topics)]
    try:
        with serve(settings) as url:
            with MetasrvClient(url, token=OPERATOR_TOKEN) as operator:
                region = operator.add_region(1 << 32 | 1, node_id=1)
            _produce(wal, region.topic, 20)
            with MetasrvClient(url, token=DATANODE_TOKEN) as datanode:
                answer = datanode.heartbeat(
                    {
                        "node_id": 1,
                        "regions": [
                            {
                                "region_id": region.region_id,
                                "topic": region.topic,
                                "flushed_entry_id": 11,
                                "topic_latest_entry_id": None,
                                "memtable_bytes": 10,
                                "manifest_version": None,
                            }
                        ],
                        "topics": [],
                    }
                )
            assert answer.rejected == []
            with MetasrvClient(url, token=OPERATOR_TOKEN) as operator:
                done = operator.wait(operator.purge([region.topic]), timeout=60)
            assert [p.state for p in done] == ["succeeded"], done
            assert admin.offsets([region.topic])[region.topic].log_start_offset == 11
            # The pool was created at start-up with the configured retention.
            configs = admin.topic_configs(pool)
            assert {t: c["retention.ms"] for t, c in configs.items()} == dict.fromkeys(
                pool, "86400000"
            )
    finally:
        admin.delete_topics(pool)
        admin.close()


@pytest.mark.parametrize(
    ("wal", "expected"),
    [
        ({}, {}),
        ({"tls": {}}, {"security.protocol": "SSL"}),
        (
            {"sasl": {"type": "PLAIN", "username": "u", "password": "p"}},
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "u",
                "sasl.password": "p",
            },
        ),
    ],
)
def test_client_config_protocol(wal: dict[str, object], expected: dict[str, str]) -> None:
    """The cases the real-broker tests (tests/metasrv/kv/test_secure_transport.py) do not reach:
    no security, TLS with the system CA store, SASL without TLS."""
    conf = client_config(load_settings(None, wal=wal).wal)
    assert conf.pop("socket.connection.setup.timeout.ms") == 3000  # connect_timeout = "3s"
    assert conf == expected
