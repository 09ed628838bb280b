"""Key stores and trust stores as Kafka configures them, read into certificates and keys.

`ssl.keystore.type` (Kafka's default JKS) and `ssl.truststore.type`:
- PEM: a file (`ssl.keystore.location`: the private key and the certificate chain; the
  key encrypted under `ssl.key.password`, or not) or inline text
  (`ssl.keystore.certificate.chain` and `ssl.keystore.key`; `ssl.truststore.certificates`).
  Kafka refuses `ssl.keystore.password` and `ssl.truststore.password` with PEM; so does this.
- PKCS12, under `ssl.keystore.password` (the key under the same password).
- JKS: a file that is a PKCS12 store is read as one (as Java's keystore.type.compat does);
  a true JKS or JCEKS store cannot be read here, and the message says how to convert it.
Every failure is a `ConfigError` naming the property that was set and what to do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import pkcs12

from tierbroker.broker.config.broker_config import ConfigError
from tierbroker.broker.config.security_settings import LISTENER_PREFIX, SecuritySettings

PEM, PKCS12, JKS = "PEM", "PKCS12", "JKS"
DEFAULT_STORE_TYPE = JKS
_JAVA_STORE_MAGIC = (b"\xfe\xed\xfe\xed", b"\xce\xce\xce\xce")  # JKS, JCEKS
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.+?-----END \1-----", re.DOTALL)


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """The `ssl.*` properties of one listener (its `listener.name.*` overrides first), each
    read with the name it was set under, for messages."""

    settings: SecuritySettings
    listener: str | None

    def get(self, name: str) -> str | None:
        return self.settings.get(name, self.listener)

    def prop(self, name: str) -> str:
        """The property that gives `name`'s value: the listener's override if set."""
        if self.listener is not None:
            override = f"{LISTENER_PREFIX}{self.listener.lower()}.{name}"
            if override in self.settings.values:
                return override
        return name

    def store_type(self, name: str) -> str:
        value = (self.get(name) or DEFAULT_STORE_TYPE).strip().upper()
        if value not in (PEM, PKCS12, JKS):
            raise ConfigError(f"{self.prop(name)}={value}: use PKCS12, PEM or JKS")
        return value


@dataclass(frozen=True, slots=True)
class KeyStore:
    """A private key and its certificate chain (the key's certificate first); `files`:
    the files read, whose change a reload looks for."""

    chain: tuple[x509.Certificate, ...]
    key: PrivateKeyTypes
    files: tuple[str, ...]

    def pem(self, passphrase: bytes) -> bytes:
        """The chain and the key (encrypted under `passphrase`) as one PEM text."""
        certs = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.chain)
        key = self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(passphrase),
        )
        return certs + key


@dataclass(frozen=True, slots=True)
class TrustStore:
    certificates: tuple[x509.Certificate, ...]
    files: tuple[str, ...]

    def pem(self) -> str:
        return "".join(
            c.public_bytes(serialization.Encoding.PEM).decode() for c in self.certificates
        )


def load_keystore(s: StoreSettings) -> KeyStore | None:
    """The listener's key store, None if none is configured."""
    kind = s.store_type("ssl.keystore.type")
    location, password = s.get("ssl.keystore.location"), s.get("ssl.keystore.password")
    key_password = s.get("ssl.key.password")
    inline_chain, inline_key = s.get("ssl.keystore.certificate.chain"), s.get("ssl.keystore.key")
    if inline_key is not None or inline_chain is not None:
        if kind != PEM:
            raise ConfigError(
                f"{s.prop('ssl.keystore.key')}: an inline key and chain need "
                f"ssl.keystore.type=PEM, not {kind}"
            )
        if inline_key is None or inline_chain is None:
            missing = "ssl.keystore.key" if inline_key is None else "ssl.keystore.certificate.chain"
            raise ConfigError(f"{s.prop(missing)} is not set: an inline key store needs both")
        if location is not None:
            raise ConfigError(
                f"{s.prop('ssl.keystore.location')} and {s.prop('ssl.keystore.key')} are both "
                "set: give the key store as a file or inline, not both"
            )
        _no_pem_password(s, "ssl.keystore.password", password)
        chain = _certificates(inline_chain.encode(), s.prop("ssl.keystore.certificate.chain"))
        key = _pem_key(inline_key.encode(), key_password, s, s.prop("ssl.keystore.key"))
        return _checked(KeyStore(chain, key, ()), s.prop("ssl.keystore.key"))
    if location is None:
        if password is not None:
            raise ConfigError(
                f"{s.prop('ssl.keystore.password')} is set without ssl.keystore.location"
            )
        return None
    where = f"{s.prop('ssl.keystore.location')}={location}"
    data = _read(location, where)
    if kind == PEM:
        _no_pem_password(s, "ssl.keystore.password", password)
        chain = _certificates(data, where)
        return _checked(KeyStore(chain, _pem_key(data, key_password, s, where), (location,)), where)
    if password is None:
        raise ConfigError(f"{where}: set ssl.keystore.password, the password of the key store")
    store = _pkcs12(data, password, where, kind)
    if store.key is None or store.cert is None:
        raise ConfigError(f"{where}: the key store holds no private key with its certificate")
    chain = (store.cert.certificate, *(c.certificate for c in store.additional_certs))
    return _checked(KeyStore(chain, store.key, (location,)), where)


def load_truststore(s: StoreSettings) -> TrustStore | None:
    """The certificates the listener trusts, None if none are configured."""
    kind = s.store_type("ssl.truststore.type")
    location, password = s.get("ssl.truststore.location"), s.get("ssl.truststore.password")
    inline = s.get("ssl.truststore.certificates")
    if inline is not None:
        if kind != PEM:
            raise ConfigError(
                f"{s.prop('ssl.truststore.certificates')} needs ssl.truststore.type=PEM, not {kind}"
            )
        if location is not None:
            raise ConfigError(
                f"{s.prop('ssl.truststore.location')} and "
                f"{s.prop('ssl.truststore.certificates')} are both set: give one"
            )
        _no_pem_password(s, "ssl.truststore.password", password)
        return TrustStore(_certificates(inline.encode(), s.prop("ssl.truststore.certificates")), ())
    if location is None:
        return None
    where = f"{s.prop('ssl.truststore.location')}={location}"
    data = _read(location, where)
    if kind == PEM:
        _no_pem_password(s, "ssl.truststore.password", password)
        return TrustStore(_certificates(data, where), (location,))
    store = _pkcs12(data, password, where, kind)
    certs = tuple(c.certificate for c in ([store.cert] if store.cert else []))
    certs += tuple(c.certificate for c in store.additional_certs)
    if not certs:
        raise ConfigError(f"{where}: the trust store holds no certificate")
    return TrustStore(certs, (location,))


def _no_pem_password(s: StoreSettings, name: str, value: str | None) -> None:
    if value is not None:
        raise ConfigError(
            f"{s.prop(name)} cannot be used with PEM stores: remove it (an encrypted PEM key "
            "takes ssl.key.password)"
        )


def _read(location: str, where: str) -> bytes:
    try:
        with open(location, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e.strerror})") from None


def _pkcs12(
    data: bytes, password: str | None, where: str, kind: str
) -> pkcs12.PKCS12KeyAndCertificates:
    if data[:4] in _JAVA_STORE_MAGIC:
        raise ConfigError(
            f"{where} is a Java (JKS or JCEKS) store, which tierbroker cannot read: convert it "
            f"with `keytool -importkeystore -srckeystore <file> -destkeystore <file>.p12 "
            "-deststoretype PKCS12`, then set the location to the .p12 file and the type to PKCS12"
        )
    try:
        return pkcs12.load_pkcs12(data, None if password is None else password.encode())
    except ValueError:
        hint = "" if kind == PKCS12 else f" (read as PKCS12, the type being {kind})"
        raise ConfigError(f"{where}: not a PKCS12 store, or the password is wrong{hint}") from None


def _certificates(data: bytes, where: str) -> tuple[x509.Certificate, ...]:
    blocks = [m.group(0) for m in _PEM_BLOCK.finditer(data) if m.group(1) == b"CERTIFICATE"]
    if not blocks:
        raise ConfigError(f"{where}: no PEM certificate (-----BEGIN CERTIFICATE-----) found")
    try:
        return tuple(x509.load_pem_x509_certificate(b) for b in blocks)
    except ValueError as e:
        raise ConfigError(f"{where}: a certificate cannot be read ({e})") from None


def _pem_key(data: bytes, password: str | None, s: StoreSettings, where: str) -> PrivateKeyTypes:
    blocks = [m.group(0) for m in _PEM_BLOCK.finditer(data) if m.group(1).endswith(b"PRIVATE KEY")]
    if len(blocks) != 1:
        raise ConfigError(f"{where}: expected one PEM private key, found {len(blocks)}")
    encrypted = blocks[0].startswith(b"-----BEGIN ENCRYPTED")
    if encrypted and password is None:
        raise ConfigError(f"{where}: the private key is encrypted: set ssl.key.password")
    try:
        return serialization.load_pem_private_key(
            blocks[0], password.encode() if encrypted and password is not None else None
        )
    except (ValueError, TypeError) as e:
        wrong = f"{s.prop('ssl.key.password')} is wrong, or " if encrypted else ""
        raise ConfigError(f"{where}: {wrong}the private key cannot be read ({e})") from None


def _checked(store: KeyStore, where: str) -> KeyStore:
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if store.key.public_key().public_bytes(der, public) != store.chain[0].public_key().public_bytes(
        der, public
    ):
        raise ConfigError(f"{where}: the private key is not the first certificate's")
    return store


def subject_alt_names(cert: x509.Certificate) -> Sequence[str]:
    """The certificate's subject alternative names, as text, sorted (for comparisons)."""
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return ()
    return sorted(str(name.value) for name in ext.value)


def modified_ns(files: Sequence[str]) -> tuple[int, ...]:
    """The modification times of `files` (-1 for one that is gone)."""
    stamps = []
    for f in files:
        try:
            stamps.append(os.stat(f).st_mtime_ns)
        except OSError:
            stamps.append(-1)
    return tuple(stamps)
