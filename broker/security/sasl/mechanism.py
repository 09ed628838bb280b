"""What every SASL mechanism's server is, and how it fails.

A mechanism server takes the client's tokens one at a time (`evaluate_response`) and
answers each with a challenge, until `complete`; then `authorization_id` is the user the
connection becomes, and `credential_expiry_ms` bounds its session (OAUTHBEARER's token).
"""

from __future__ import annotations

from typing import Protocol

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
OAUTHBEARER = "OAUTHBEARER"
GSSAPI = "GSSAPI"
SUPPORTED_MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512, OAUTHBEARER)


class SaslAuthenticationError(Exception):
    """Authentication failed with a message the client may read (Kafka's
    SaslAuthenticationException): it never says whether the user exists. `reason`, for
    the broker's log only, may say more."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


class InvalidCredentialsError(Exception):
    """Authentication failed with a reason only the broker's log may see (Kafka's
    SaslException); the client is told only that its credentials are invalid."""


class IllegalSaslStateError(Exception):
    """A request or token the exchange does not allow now; the connection is closed."""


class SaslServer(Protocol):
    @property
    def mechanism(self) -> str: ...

    @property
    def complete(self) -> bool: ...

    @property
    def authorization_id(self) -> str:
        """The user the client claims to be (empty until it said); authenticated only
        once `complete`."""

    @property
    def credential_expiry_ms(self) -> int | None:
        """Wall-clock ms when the credential expires, if it does (KIP-368)."""

    async def evaluate_response(self, response: bytes) -> bytes:
        """The challenge answering the client's token; raises SaslAuthenticationError,
        InvalidCredentialsError or IllegalSaslStateError."""
