"""The security of each listener, built from the broker's config: what the socket server
applies to the connections it accepts, and what this broker's own connections to the
others use on the inter-broker listener.

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
from tierbroker.broker.security.ssl_factory import client_context
from tierbroker.broker.security.ssl_principal import NoMatchingRule
from tierbroker.broker.security.ssl_stores import StoreSettings


def listener_ssl(config: BrokerConfig) -> ListenerSsl:
    """The TLS listeners' contexts and principal builders (`ConfigError` if bad)."""
    listeners = config.listener_config
    return ListenerSsl(config.security, listeners.listeners, listeners.inter_broker)


def check_tls(config: BrokerConfig) -> None:
    """Build what the broker's TLS needs, to refuse bad settings before anything starts."""
    listener_ssl(config)
    inter_broker_channel(config)


def listener_security(config: BrokerConfig, tls: ListenerSsl) -> ListenerSecurity:
    """How accepted connections are secured, listener by listener."""

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

    return ListenerSecurity(ssl_context_for=tls.context_for, principal_for=principal_for)


def inter_broker_channel(config: BrokerConfig) -> InterBrokerChannel:
    """The inter-broker listener, and how this broker connects to it on its peers."""
    name = config.listener_config.inter_broker
    listener = config.listener_config.listener(name)
    if not listener.security_protocol.uses_tls:
        return InterBrokerChannel(listener=name)
    context = client_context(StoreSettings(config.security, name))
    return InterBrokerChannel(listener=name, security=ClientSecurity(ssl_context=context))
