"""The security of each listener, built from the broker's config: what the socket server
applies to the connections it accepts, and what this broker's own connections to the
others use on the inter-broker listener. SASL's part is `listener_sasl`'s.

TLS: `ListenerSsl` gives each TLS listener's context (swapped by a reload) and the
principal of its connections; a connection whose certificate no
`ssl.principal.mapping.rules` rule maps is closed and counted as a failed
authentication, as Kafka fails it.
The inter-broker client checks the peers' certificates with the inter-broker listener's
trust store (and their host names, `ssl.endpoint.identification.algorithm`) and shows
its key store to peers that ask for a certificate. `check_tls` builds both at start, so
bad settings stop the start with one line (`ConfigError`).
"""

from __future__ import annotations

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.network.broker_client import ClientSecurity
from tierbroker.broker.network.inter_broker import InterBrokerChannel
from tierbroker.broker.network.socket_server import KafkaConnection, ListenerSecurity
from tierbroker.broker.security.listener_ssl import ListenerSsl
from tierbroker.broker.security.principal import ANONYMOUS, KafkaPrincipal
from tierbroker.broker.security.sasl.settings import SaslListenerSettings
from tierbroker.broker.security.ssl_factory import client_context
from tierbroker.broker.security.ssl_principal import NoMatchingRule
from tierbroker.broker.security.ssl_stores import StoreSettings
from tierbroker.broker.server.listener_sasl import (
    authenticator_factory,
    inter_broker_authenticator,
)


def listener_ssl(config: BrokerConfig) -> ListenerSsl:
    """The TLS listeners' contexts and principal builders (`ConfigError` if bad)."""
    listeners = config.listener_config
    return ListenerSsl(config.security, listeners.listeners, listeners.inter_broker)


def check_tls(config: BrokerConfig) -> None:
    """Build what the broker's TLS needs, to refuse bad settings before anything starts."""
    listener_ssl(config)
    inter_broker_channel(config)


def listener_security(
    config: BrokerConfig, tls: ListenerSsl, sasl: dict[str, SaslListenerSettings]
) -> ListenerSecurity:
    """How accepted connections are secured, listener by listener (`sasl`: the SASL
    listeners' settings, `listener_sasl.sasl_settings`)."""

    def principal_for(connection: KafkaConnection) -> KafkaPrincipal:
        transport = connection.transport
        ssl_object = None if transport is None else transport.get_extra_info("ssl_object")
        try:
            return tls.principal(connection.listener, ssl_object)
        except NoMatchingRule as e:  # Kafka fails the authentication
            name = connection.listener.name
            connection.server.metrics.authentication_failed(name, connection.ip, str(e))
            if transport is not None:
                transport.close()
            return ANONYMOUS

    return ListenerSecurity(
        ssl_context_for=tls.context_for,
        principal_for=principal_for,
        authenticator_for=authenticator_factory(sasl),
    )


def inter_broker_channel(config: BrokerConfig) -> InterBrokerChannel:
    """The inter-broker listener, and how this broker connects to it on its peers: TLS
    with the listener's stores, then a SASL login, as its protocol says."""
    name = config.listener_config.inter_broker
    listener = config.listener_config.listener(name)
    authenticate = inter_broker_authenticator(config)
    context = (
        client_context(StoreSettings(config.security, name))
        if listener.security_protocol.uses_tls
        else None
    )
    if context is None and authenticate is None:
        return InterBrokerChannel(listener=name)
    return InterBrokerChannel(
        listener=name, security=ClientSecurity(ssl_context=context, authenticate=authenticate)
    )
