"""librdkafka settings every Kafka client of metasrv shares: TLS, SASL, connect timeout.

`[wal.tls]` and `[wal.sasl]` keep GreptimeDB's key names; this is the one place they
become librdkafka properties, so the admin client, the simulator's producers and
consumers, and the reconcile job's reads connect the same way.
"""

from __future__ import annotations

from metasrv.settings import WalSettings

ClientConfig = dict[str, str | int | float | bool]


def client_config(wal: WalSettings) -> ClientConfig:
    """librdkafka properties for `wal` (without `bootstrap.servers`)."""
    conf: ClientConfig = {
        "socket.connection.setup.timeout.ms": max(1000, int(wal.connect_timeout * 1000)),
    }
    tls, sasl = wal.tls, wal.sasl
    if sasl is not None:
        conf["security.protocol"] = "SASL_SSL" if tls is not None else "SASL_PLAINTEXT"
        conf["sasl.mechanism"] = sasl.type
        conf["sasl.username"] = sasl.username
        conf["sasl.password"] = sasl.password.get_secret_value()
    elif tls is not None:
        conf["security.protocol"] = "SSL"
    if tls is not None:
        if tls.server_ca_cert_path:
            conf["ssl.ca.location"] = tls.server_ca_cert_path
        if tls.client_cert_path and tls.client_key_path:
            conf["ssl.certificate.location"] = tls.client_cert_path
            conf["ssl.key.location"] = tls.client_key_path
    return conf
