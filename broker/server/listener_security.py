"""The security of each listener, built from the broker's config: what the socket server
applies to the connections it accepts, and what this broker's own connections to the
others use on the inter-broker listener. SASL's part is `listener_sasl`'s."""

from __future__ import annotations

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.network.broker_client import ClientSecurity
from tierbroker.broker.network.inter_broker import InterBrokerChannel
from tierbroker.broker.network.socket_server import ListenerSecurity
from tierbroker.broker.security.sasl.settings import SaslListenerSettings
from tierbroker.broker.server.listener_sasl import (
    authenticator_factory,
    inter_broker_authenticator,
)


def listener_security(
    config: BrokerConfig, sasl: dict[str, SaslListenerSettings]
) -> ListenerSecurity:
    """How accepted connections are secured, listener by listener (`sasl`: the SASL
    listeners' settings, `listener_sasl.sasl_settings`)."""
    return ListenerSecurity(authenticator_for=authenticator_factory(sasl))


def inter_broker_channel(config: BrokerConfig) -> InterBrokerChannel:
    """The inter-broker listener, and how this broker connects to it on its peers."""
    authenticate = inter_broker_authenticator(config)
    return InterBrokerChannel(
        listener=config.listener_config.inter_broker,
        security=None if authenticate is None else ClientSecurity(authenticate=authenticate),
    )
