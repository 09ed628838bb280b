"""How this broker reaches the others: on the inter-broker listener, with its security.

Every request a broker sends another (follower fetches, forwarded internal-topic writes,
transaction markers and checks) goes to the peer's endpoint on `inter.broker.listener.name`
as the peer registered it, secured as that listener is.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierbroker.broker.config.listeners import Listener
from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.network.broker_client import BrokerClient, BrokerClients, ClientSecurity


@dataclass(frozen=True, slots=True)
class InterBrokerChannel:
    listener: str = "PLAINTEXT"
    security: ClientSecurity | None = None

    def client(self, address: Listener, client_id: str, request_timeout_ms: int) -> BrokerClient:
        return BrokerClient(
            address.host, address.port, client_id, request_timeout_ms, self.security
        )


class InterBrokerClients:
    """One `BrokerClient` per peer, made on first use, found by broker id."""

    def __init__(
        self,
        channel: InterBrokerChannel,
        cache: MetadataCache,
        client_id: str,
        request_timeout_ms: int,
    ) -> None:
        self.channel = channel
        self.cache = cache
        self._clients = BrokerClients(client_id, request_timeout_ms, channel.security)

    def address(self, broker_id: int) -> Listener | None:
        """The live broker's endpoint on the inter-broker listener."""
        return address_of(self.cache, self.channel, broker_id)

    def for_broker(self, broker_id: int) -> BrokerClient | None:
        """A client to the live broker `broker_id`, or None if it is not registered."""
        address = self.address(broker_id)
        return None if address is None else self._clients.get(address.host, address.port)

    async def close(self) -> None:
        await self._clients.close()


def address_of(
    cache: MetadataCache, channel: InterBrokerChannel, broker_id: int
) -> Listener | None:
    registration = cache.brokers.get(broker_id)
    return None if registration is None else registration.endpoint(channel.listener)
