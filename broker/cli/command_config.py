"""`--command-config FILE`: the client properties of a secured listener, as Kafka's tools
take them (`kafka-topics.sh --command-config client.properties`).

The file holds Kafka's Java client properties: `security.protocol`, `sasl.mechanism`,
`sasl.jaas.config` (PlainLoginModule or ScramLoginModule with `username` and `password`;
OAuthBearerLoginModule with `unsecuredLoginStringClaim_sub` for unsecured tokens),
`ssl.truststore.*`, `ssl.keystore.*` (PEM or PKCS12, files or inline PEM) and
`ssl.endpoint.identification.algorithm`. Every command reads it: those built on
librdkafka get the same settings in its names (stores as PEM text), those that speak the
protocol themselves (`WireAdmin`) a TLS context and a SASL login. A property librdkafka
knows by its own name (`ssl.ca.location`, ...) passes through to it as it is.
`TIERBROKER_COMMAND_CONFIG` names the file when the option is not given.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from tierbroker.broker.network.broker_client import ClientSecurity

ENV = "TIERBROKER_COMMAND_CONFIG"
OPTION = "--command-config"
# Kafka's names that librdkafka spells otherwise, or that only the JVM reads.
_TRANSLATED = frozenset(
    {
        "sasl.jaas.config",
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.password",
        "ssl.truststore.certificates",
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
    }
)

_properties: dict[str, str] = {}  # this command's, read once by the command line's callback


def load(path: Path | None) -> None:
    """Read the command's client properties from `path` (none: no security settings)."""
    from tierbroker.broker.config.broker_config import ConfigError, parse_properties

    _properties.clear()
    if path is None:
        return
    try:
        _properties.update(parse_properties(path.read_text(encoding="utf-8")))
    except (OSError, ConfigError) as e:
        raise _refused(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None


def librdkafka_settings() -> dict[str, str]:
    """The command config in librdkafka's names."""
    settings = {k: v for k, v in _properties.items() if k not in _TRANSLATED}
    if not _properties:
        return settings
    try:
        settings.update(_sasl_settings())
        settings.update(_tls_settings())
    except ValueError as e:  # ConfigError and JaasConfigError are ValueErrors
        raise _refused(str(e)) from None
    return settings


def wire_security() -> ClientSecurity | None:
    """A `ClientSecurity` for `WireAdmin`'s connections, or None in the clear."""
    from tierbroker.broker.config.security_settings import SecuritySettings
    from tierbroker.broker.network.broker_client import ClientSecurity
    from tierbroker.broker.network.sasl_client import SaslClientAuthenticator
    from tierbroker.broker.security.ssl_factory import client_context
    from tierbroker.broker.security.ssl_stores import StoreSettings

    protocol = _properties.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    try:
        context = None
        if protocol in ("SSL", "SASL_SSL"):
            context = client_context(StoreSettings(SecuritySettings(_properties), None))
        authenticate = None
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            mechanism = _properties.get("sasl.mechanism", "GSSAPI").upper()
            username, password = _credentials()
            authenticate = SaslClientAuthenticator(mechanism, username, password)
    except ValueError as e:
        raise _refused(str(e)) from None
    return ClientSecurity(ssl_context=context, authenticate=authenticate)


def _refused(message: str) -> typer.BadParameter:
    """A usage error naming the option: one line, exit code 2."""
    return typer.BadParameter(message, param_hint=f"'{OPTION}'")


def _credentials() -> tuple[str, str]:
    from tierbroker.broker.security.sasl.jaas import jaas_options

    options = jaas_options(_properties.get("sasl.jaas.config", ""))
    if "username" not in options or "password" not in options:
        raise ValueError("sasl.jaas.config: give the login module's username and password")
    return options["username"], options["password"]


def _sasl_settings() -> dict[str, str]:
    from tierbroker.broker.security.sasl.jaas import jaas_options

    jaas = _properties.get("sasl.jaas.config")
    if jaas is None:
        return {}
    options = jaas_options(jaas)
    if "unsecuredLoginStringClaim_sub" in options:  # Kafka's unsecured OAUTHBEARER login
        return {
            "enable.sasl.oauthbearer.unsecure.jwt": "true",
            "sasl.oauthbearer.config": f"principal={options['unsecuredLoginStringClaim_sub']}",
        }
    username, password = _credentials()
    return {"sasl.username": username, "sasl.password": password}


def _tls_settings() -> dict[str, str]:
    """The stores as PEM text, which librdkafka takes whatever the file's format."""
    from tierbroker.broker.config.security_settings import SecuritySettings
    from tierbroker.broker.security.ssl_stores import (
        StoreSettings,
        load_keystore,
        load_truststore,
    )

    stores = StoreSettings(SecuritySettings(_properties), None)
    settings: dict[str, str] = {}
    truststore = load_truststore(stores)
    if truststore is not None:
        settings["ssl.ca.pem"] = truststore.pem()
    keystore = load_keystore(stores)
    if keystore is not None:
        passphrase = secrets.token_urlsafe(24)
        pem = keystore.pem(passphrase.encode()).decode()
        split = pem.index("-----BEGIN ENCRYPTED PRIVATE KEY-----")
        settings.update(
            {
                "ssl.certificate.pem": pem[:split],
                "ssl.key.pem": pem[split:],
                "ssl.key.password": passphrase,
            }
        )
    algorithm = _properties.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        settings["ssl.endpoint.identification.algorithm"] = algorithm.strip() or "none"
    return settings
