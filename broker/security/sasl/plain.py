"""PLAIN (RFC 4616) as Kafka's PlainSaslServer: one token, `authzid NUL authcid NUL passwd`,
checked against the listener's JAAS users (`user_<name>="<password>"`)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from tierbroker.broker.security.sasl.mechanism import (
    PLAIN,
    IllegalSaslStateError,
    SaslAuthenticationError,
)


class PlainSaslServer:
    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users
        self._complete = False
        self._authorization_id = ""

    mechanism = PLAIN
    credential_expiry_ms = None

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def authorization_id(self) -> str:
        return self._authorization_id

    async def evaluate_response(self, response: bytes) -> bytes:
        if self._complete:
            raise IllegalSaslStateError("PLAIN takes one token")
        tokens = response.decode("utf-8", errors="replace").split("\0")
        if len(tokens) != 3:
            raise SaslAuthenticationError(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}"
            )
        authorization_id, username, password = tokens
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        self._authorization_id = username
        expected = self._users.get(username)
        # Compared in constant time, and compared even for an unknown user.
        matches = hmac.compare_digest(
            (expected if expected is not None else "\0").encode(), password.encode()
        )
        if expected is None or not matches:
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        if authorization_id and authorization_id != username:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is "
                "different from username"
            )
        self._complete = True
        return b""
