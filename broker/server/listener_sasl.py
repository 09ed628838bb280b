"""SASL of the broker's listeners, built from its config: each SASL listener's settings
(checked at start, `check_sasl`, so a broker that cannot authenticate does not start),
the authenticator of each accepted connection, and this broker's own login to the others
on a SASL inter-broker listener (`sasl.mechanism.inter.broker.protocol`, with the
`username` and `password` of that listener's JAAS entry for the mechanism, as Kafka's
brokers take them)."""

from __future__ import annotations

from collections.abc import Callable

from tierbroker.broker.config.broker_config import BrokerConfig, ConfigError
from tierbroker.broker.network.sasl_client import SaslClientAuthenticator
from tierbroker.broker.network.socket_server import Authenticator, KafkaConnection
from tierbroker.broker.security.sasl.authenticator import SaslServerAuthenticator
from tierbroker.broker.security.sasl.jaas import JaasConfigError, jaas_options
from tierbroker.broker.security.sasl.mechanism import GSSAPI, PLAIN
from tierbroker.broker.security.sasl.scram import ScramMechanism
from tierbroker.broker.security.sasl.scram_server import CredentialLookup
from tierbroker.broker.security.sasl.settings import (
    JAAS_CONFIG,
    SaslConfigError,
    SaslListenerSettings,
    for_listener,
)

INTER_BROKER_MECHANISM = "sasl.mechanism.inter.broker.protocol"


def sasl_settings(
    config: BrokerConfig, credentials: CredentialLookup
) -> dict[str, SaslListenerSettings]:
    """Each SASL listener's settings, by listener name; ConfigError names what is wrong."""
    found = {}
    for listener in config.listener_config.listeners:
        if listener.security_protocol.uses_sasl:
            try:
                found[listener.name] = for_listener(listener.name, config.security, credentials)
            except SaslConfigError as e:
                raise ConfigError(str(e)) from None
    return found


def check_sasl(config: BrokerConfig) -> None:
    """Build what the broker's SASL needs, to refuse bad settings before anything starts."""
    sasl_settings(config, lambda _mechanism, _user: None)
    inter_broker_authenticator(config)


def authenticator_factory(
    settings: dict[str, SaslListenerSettings],
) -> Callable[[KafkaConnection], Authenticator | None]:
    """What the socket server calls for each connection of a SASL listener."""

    def authenticator_for(connection: KafkaConnection) -> Authenticator | None:
        listener_settings = settings.get(connection.listener.name)
        if listener_settings is None:
            return None
        # Until authenticated a client may send only small frames (Kafka's
        # sasl.server.max.receive.size); the full size comes back once it is.
        connection.reader.max_frame_bytes = min(
            connection.reader.max_frame_bytes, listener_settings.max_receive_bytes
        )
        return SaslServerAuthenticator(listener_settings, connection.ip, connection.server.metrics)

    return authenticator_for


def inter_broker_authenticator(config: BrokerConfig) -> SaslClientAuthenticator | None:
    """This broker's login to its peers, when the inter-broker listener uses SASL."""
    listeners = config.listener_config
    listener = listeners.listener(listeners.inter_broker)
    if not listener.security_protocol.uses_sasl:
        return None
    mechanism = config.security.get(INTER_BROKER_MECHANISM) or GSSAPI
    if mechanism != PLAIN and ScramMechanism.by_name(mechanism) is None:
        raise ConfigError(
            f"{INTER_BROKER_MECHANISM}={mechanism}"
            f"{' (the default)' if mechanism == GSSAPI else ''}: the inter-broker listener "
            f"{listener.name} uses SASL; set it to PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
        )
    name = f"listener.name.{listener.name.lower()}.{mechanism.lower()}.{JAAS_CONFIG}"
    text = config.security.get(JAAS_CONFIG, listener.name, mechanism)
    try:
        options = jaas_options(text) if text else {}
    except JaasConfigError as e:
        raise ConfigError(f"{name} does not parse: {e}") from None
    username, password = options.get("username"), options.get("password")
    if not username or not password:
        raise ConfigError(
            f"{name} needs username and password: the credentials this broker "
            f"authenticates with to the others over {mechanism}"
        )
    return SaslClientAuthenticator(mechanism, username, password)
