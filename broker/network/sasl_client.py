"""`SaslClientAuthenticator`: this broker's SASL login to the others on the inter-broker
listener (Kafka's SaslClientAuthenticator), PLAIN or SCRAM-SHA-256/512.

Run by `BrokerClient` on each new connection after ApiVersions: SaslHandshake v1, then
SaslAuthenticate requests (at the version both sides know) through the client's request
path, so each is bounded by its request timeout. A refusal raises
`AuthenticationFailed`, which the client reports as the peer being unavailable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tierbroker.broker.network.broker_client import BrokerClient
from tierbroker.broker.security.sasl.mechanism import PLAIN
from tierbroker.broker.security.sasl.scram import ScramMechanism
from tierbroker.broker.security.sasl.scram_client import ScramError, ScramSaslClient
from tierbroker.protocol.client_codec import request_type
from tierbroker.protocol.errors import ErrorCode

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


class AuthenticationFailed(ConnectionError):
    """The peer refused this broker's credentials or mechanism."""


@dataclass(frozen=True, slots=True)
class SaslClientAuthenticator:
    mechanism: str  # sasl.mechanism.inter.broker.protocol
    username: str
    password: str = field(repr=False)

    async def __call__(self, client: BrokerClient) -> None:
        handshake = await client.send_connected(
            request_type(SASL_HANDSHAKE, 1)(mechanism=self.mechanism)
        )
        if handshake.error_code != ErrorCode.none:
            raise AuthenticationFailed(
                f"{client}: SASL mechanism {self.mechanism} refused ({handshake.error_code.name}); "
                f"the peer enables {', '.join(handshake.mechanisms)}"
            )
        scram = ScramMechanism.by_name(self.mechanism)
        if scram is None:
            assert self.mechanism == PLAIN
            await self._send(client, f"\0{self.username}\0{self.password}".encode())
            return
        exchange = ScramSaslClient(scram, self.username, self.password)
        server_first = await self._send(client, exchange.first_message())
        try:
            server_final = await self._send(client, exchange.final_message(server_first))
            exchange.verify(server_final)
        except ScramError as e:
            raise AuthenticationFailed(f"{client}: {e}") from None

    async def _send(self, client: BrokerClient, token: bytes) -> bytes:
        version = client.version_for(SASL_AUTHENTICATE)
        response = await client.send_connected(
            request_type(SASL_AUTHENTICATE, version)(auth_bytes=token)
        )
        if response.error_code != ErrorCode.none:
            raise AuthenticationFailed(
                f"{client}: SASL authentication as {self.username!r} failed: "
                f"{response.error_message or response.error_code.name}"
            )
        return bytes(response.auth_bytes)
