"""A throw-away certificate authority for the local stack's TLS listeners (openssl CLI).

One CA signs a server certificate valid for 127.0.0.1 / localhost and a client
certificate; keys are unencrypted PKCS#8 PEM, which Kafka's PEM keystores, etcd and
librdkafka all read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolbox.stack._process import run


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files `make_pki` wrote."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @property
    def server_keystore(self) -> Path:
        """Server key followed by its certificate (Kafka's `ssl.keystore.type=PEM` file)."""
        return self.server_cert.with_name("server-keystore.pem")


def make_pki(directory: Path, *, days: int = 2) -> Pki:
    """Create (or reuse) a CA, a server and a client certificate under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
    )
    if pki.server_keystore.exists():
        return pki
    ca_key = directory / "ca-key.pem"
    _new_key(directory, ca_key)
    _openssl(
        directory,
        "req",
        "-x509",
        "-new",
        "-key",
        str(ca_key),
        "-sha256",
        "-days",
        str(days),
        "-subj",
        "/CN=metasrv-stack-ca",
        "-out",
        str(pki.ca_cert),
    )
    _signed(
        directory,
        ca_key,
        pki.ca_cert,
        "server",
        pki.server_key,
        pki.server_cert,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        days,
    )
    _signed(
        directory,
        ca_key,
        pki.ca_cert,
        "client",
        pki.client_key,
        pki.client_cert,
        "extendedKeyUsage=clientAuth\n",
        days,
    )
    pki.server_keystore.write_text(pki.server_key.read_text() + pki.server_cert.read_text())
    return pki


def _signed(
    directory: Path,
    ca_key: Path,
    ca_cert: Path,
    name: str,
    key: Path,
    cert: Path,
    extensions: str,
    days: int,
) -> None:
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _new_key(directory, key)
    _openssl(
        directory, "req", "-new", "-key", str(key), "-subj", f"/CN=metasrv-{name}", "-out", str(csr)
    )
    _openssl(
        directory,
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca_cert),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        str(days),
        "-sha256",
        "-extfile",
        str(ext),
        "-out",
        str(cert),
    )


def _new_key(directory: Path, key: Path) -> None:
    """An unencrypted P-256 key in PKCS#8 PEM."""
    _openssl(directory, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(key))  # fmt: skip


def _openssl(directory: Path, *args: str) -> None:
    run(
        ["openssl", *args],
        what=f"openssl {args[0]}",
        log_file=directory / "openssl.log",
        cwd=directory,
    )
