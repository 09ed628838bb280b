"""`ssl.SSLContext`s from Kafka's `ssl.*` properties, as Kafka's `DefaultSslEngineFactory`.

A server context per TLS listener (`server_context`) and the context of this broker's
connections to other brokers (`client_context`), each from the listener's properties
(`listener.name.<l>.ssl.*` before `ssl.*`), with Kafka's defaults:
- `ssl.keystore.*` / `ssl.truststore.*`: see `ssl_stores`; a server needs a key store,
  and without a trust store client certificates are checked against the system's CAs.
- `ssl.client.auth` none (default), requested, required: the server asks no certificate,
  asks one and takes a client without (its principal then ANONYMOUS), or refuses a
  client without one.
- `ssl.enabled.protocols` (TLSv1.2,TLSv1.3) and `ssl.protocol` (TLSv1.3, the highest
  allowed): OpenSSL takes a range, from the lowest enabled to the highest; versions
  OpenSSL's security level refuses (TLSv1, TLSv1.1) stay refused.
- `ssl.cipher.suites` (default: OpenSSL's): Java / IANA names or OpenSSL's
  (`cipher_suites`).
- `ssl.endpoint.identification.algorithm` (https): a client checks that the broker's
  certificate names the host it dialled; empty: it does not.
Renegotiation is off, as in Kafka. Bad settings raise `ConfigError` naming the property.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass

from tierbroker.broker.config.broker_config import ConfigError
from tierbroker.broker.security.cipher_suites import names_tls13, openssl_cipher_list
from tierbroker.broker.security.ssl_stores import (
    KeyStore,
    StoreSettings,
    TrustStore,
    load_keystore,
    load_truststore,
)

DEFAULT_ENABLED_PROTOCOLS = "TLSv1.2,TLSv1.3"
DEFAULT_PROTOCOL = "TLSv1.3"
_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
# `ssl.protocol` names a Java SSLContext: the highest version it speaks.
_PROTOCOL_CEILINGS = {
    "TLS": ssl.TLSVersion.TLSv1_3,
    "SSL": ssl.TLSVersion.TLSv1_3,
    **_VERSIONS,
}
CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class ServerSsl:
    """A listener's server context, and the stores it was made of (for reloads)."""

    context: ssl.SSLContext
    keystore: KeyStore
    truststore: TrustStore | None


def server_context(s: StoreSettings) -> ServerSsl:
    """The server context of listener `s.listener`."""
    keystore = load_keystore(s)
    if keystore is None:
        raise ConfigError(
            f"listener {s.listener} uses TLS and has no key store: set "
            f"{s.prop('ssl.keystore.location')} (or ssl.keystore.certificate.chain and "
            "ssl.keystore.key with ssl.keystore.type=PEM)"
        )
    truststore = load_truststore(s)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(context, s, keystore, truststore, ssl.Purpose.CLIENT_AUTH)
    value = (s.get("ssl.client.auth") or "none").strip().lower()
    if value not in CLIENT_AUTH:
        raise ConfigError(f"{s.prop('ssl.client.auth')}={value}: use none, requested or required")
    context.verify_mode = CLIENT_AUTH[value]
    return ServerSsl(context, keystore, truststore)


def client_context(s: StoreSettings) -> ssl.SSLContext:
    """The context of this broker's connections to listener `s.listener` of others: the
    broker's certificate is checked (and its host name, by default), and this broker's key
    store, if configured, answers a server that asks for a certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _common(context, s, load_keystore(s), load_truststore(s), ssl.Purpose.SERVER_AUTH)
    configured = s.get("ssl.endpoint.identification.algorithm")
    algorithm = "https" if configured is None else configured.strip().lower()
    if algorithm not in ("https", ""):
        raise ConfigError(
            f"{s.prop('ssl.endpoint.identification.algorithm')}={algorithm}: use https (the "
            "broker's certificate must name its host) or an empty value (no host check)"
        )
    context.check_hostname = algorithm == "https"
    return context


def _common(
    context: ssl.SSLContext,
    s: StoreSettings,
    keystore: KeyStore | None,
    trust: TrustStore | None,
    purpose: ssl.Purpose,
) -> None:
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.minimum_version, context.maximum_version = _version_range(s)
    suites = [c.strip() for c in (s.get("ssl.cipher.suites") or "").split(",") if c.strip()]
    if suites:
        ciphers = openssl_cipher_list(suites)
        try:
            context.set_ciphers(ciphers or "aNULL:!aNULL")  # none for TLS 1.2 and below
        except ssl.SSLError:
            raise ConfigError(
                f"{s.prop('ssl.cipher.suites')}={','.join(suites)}: OpenSSL knows none of "
                "these cipher suites: name them as Kafka does (TLS_ECDHE_RSA_WITH_AES_256_GCM_"
                "SHA384) or as OpenSSL does (ECDHE-RSA-AES256-GCM-SHA384)"
            ) from None
        if not names_tls13(suites):
            context.maximum_version = min(context.maximum_version, ssl.TLSVersion.TLSv1_2)
    if keystore is not None:
        _load_key(context, keystore, s)
    if trust is not None:
        context.load_verify_locations(cadata=trust.pem())
    else:
        context.load_default_certs(purpose)


def _version_range(s: StoreSettings) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    prop = s.prop("ssl.enabled.protocols")
    names = [
        p.strip() for p in (s.get("ssl.enabled.protocols") or DEFAULT_ENABLED_PROTOCOLS).split(",")
    ]
    unknown = [n for n in names if n not in _VERSIONS]
    if unknown or not any(names):
        raise ConfigError(f"{prop}={','.join(names)}: use some of {', '.join(_VERSIONS)}")
    protocol = (s.get("ssl.protocol") or DEFAULT_PROTOCOL).strip()
    ceiling = _PROTOCOL_CEILINGS.get(protocol)
    if ceiling is None:
        raise ConfigError(f"{s.prop('ssl.protocol')}={protocol}: use TLSv1.3, TLSv1.2 or TLS")
    versions = [_VERSIONS[n] for n in names if _VERSIONS[n] <= ceiling]
    if not versions:
        raise ConfigError(
            f"{prop}={','.join(names)}: none of these is allowed by ssl.protocol={protocol}"
        )
    return min(versions), max(versions)


def _load_key(context: ssl.SSLContext, keystore: KeyStore, s: StoreSettings) -> None:
    """OpenSSL loads a key from a file only: the chain and the key, encrypted under a
    passphrase used once, go through a private temporary file, removed at once."""
    passphrase = os.urandom(24).hex().encode()
    with tempfile.NamedTemporaryFile(prefix="tierbroker-key-", suffix=".pem") as f:
        f.write(keystore.pem(passphrase))
        f.flush()
        try:
            context.load_cert_chain(f.name, password=passphrase)
        except ssl.SSLError as e:
            raise ConfigError(
                f"{s.prop('ssl.keystore.location')}: OpenSSL refuses the key store ({e})"
            ) from None
