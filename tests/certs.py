"""Certificates for TLS tests, made with the `openssl` command once per test session.

`session_certs()` returns a `Certificates` in a temporary directory (removed at exit): a CA, a
broker certificate it signed with SAN DNS:localhost,IP:127.0.0.1 (what clients check of
the host they dialled), client certificates with chosen subjects, and a second, unrelated
CA with a broker and a client certificate of its own. Each certificate comes as PEM (its
key unencrypted, and encrypted as PKCS#8 with `KEY_PASSWORD`) and as PKCS12 (password
`STORE_PASSWORD`). More client certificates: `Certificates.client(subject)`.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

STORE_PASSWORD = "store-secret"
KEY_PASSWORD = "key-secret"
BROKER_SAN = "DNS:localhost,IP:127.0.0.1"
DAYS = "3"


def openssl(*args: str | Path) -> None:
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed:\n{done.stderr}")


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate (`cert`, PEM), its key (`key`: PEM, unencrypted; `encrypted_key`: PKCS#8
    under `KEY_PASSWORD`), `chain` (the certificate then its CA's, PEM) and `p12` (key and
    chain, under `STORE_PASSWORD`)."""

    subject: str
    cert: Path
    key: Path
    encrypted_key: Path
    chain: Path
    p12: Path


@dataclass(frozen=True, slots=True)
class Authority:
    """A self-signed CA that issues certificates into `directory`."""

    name: str
    cert: Path
    key: Path
    directory: Path

    @classmethod
    def create(cls, directory: Path, name: str) -> Authority:
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
            "-days", DAYS, "-subj", f"/CN={name}",
        )  # fmt: skip
        return cls(name, cert, key, directory)

    def issue(self, name: str, subject: str, san: str | None = None) -> Issued:
        """A certificate for `subject` signed by this CA, with `san` (`DNS:localhost`) if
        given. `subject` is in openssl's `/O=y/CN=x` form, in DER order, which Kafka's
        principal reverses: `User:CN=x,O=y`."""
        d = self.directory
        key, csr, cert = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem"
        openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", subject
        )
        extensions = d / f"{name}.ext"
        extensions.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
        openssl(
            "x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-CAcreateserial",
            "-out", cert, "-days", DAYS, "-extfile", extensions,
        )  # fmt: skip
        encrypted = d / f"{name}.encrypted.key"
        openssl(
            "pkcs8", "-topk8", "-v2", "aes-256-cbc", "-in", key, "-out", encrypted,
            "-passout", f"pass:{KEY_PASSWORD}",
        )  # fmt: skip
        chain = d / f"{name}.chain.pem"
        chain.write_bytes(cert.read_bytes() + self.cert.read_bytes())
        p12 = d / f"{name}.p12"
        openssl(
            "pkcs12", "-export", "-in", cert, "-inkey", key, "-certfile", self.cert, "-name", name,
            "-out", p12, "-passout", f"pass:{STORE_PASSWORD}",
        )  # fmt: skip
        return Issued(subject, cert, key, encrypted, chain, p12)


@dataclass(frozen=True, slots=True)
class Certificates:
    """`ca` and what it signed; `other_ca`, which no broker or client trusts by default,
    and what it signed."""

    ca: Authority
    broker: Issued
    client: Issued  # subject /O=tierbroker-tests/CN=client: User:CN=client,O=tierbroker-tests
    other_ca: Authority
    other_broker: Issued
    other_client: Issued
    truststore_p12: Path  # `ca` as a PKCS12 trust store, under STORE_PASSWORD

    def client_cert(self, name: str, subject: str) -> Issued:
        """Another client certificate signed by `ca`."""
        return self.ca.issue(name, subject)


@functools.cache
def session_certs() -> Certificates:
    """The session's certificates (made on first use)."""
    directory = Path(tempfile.mkdtemp(prefix="tierbroker-certs-"))
    atexit.register(shutil.rmtree, directory, True)
    ca = Authority.create(directory, "test-ca")
    other = Authority.create(directory, "other-ca")
    truststore = directory / "truststore.p12"
    openssl(
        "pkcs12", "-export", "-nokeys", "-in", ca.cert, "-out", truststore,
        "-passout", f"pass:{STORE_PASSWORD}",
    )  # fmt: skip
    return Certificates(
        ca=ca,
        broker=ca.issue("broker", "/O=tierbroker-tests/CN=localhost", BROKER_SAN),
        client=ca.issue("client", "/O=tierbroker-tests/CN=client"),
        other_ca=other,
        other_broker=other.issue("other-broker", "/O=other/CN=localhost", BROKER_SAN),
        other_client=other.issue("other-client", "/O=other/CN=intruder"),
        truststore_p12=truststore,
    )
