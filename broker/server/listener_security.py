"""The security of each listener, built from the broker's config: what the socket server
applies to the connections it accepts, and what this broker's own connections to the
others use on the inter-broker listener."""

from __future__ import annotations

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.network.inter_broker import InterBrokerChannel
from tierbroker.broker.network.socket_server import ListenerSecurity


def listener_security(config: BrokerConfig) -> ListenerSecurity:
    """How accepted connections are secured, listener by listener."""
    return ListenerSecurity()


def inter_broker_channel(config: BrokerConfig) -> InterBrokerChannel:
    """The inter-broker listener, and how this broker connects to it on its peers."""
    return InterBrokerChannel(listener=config.listener_config.inter_broker)
