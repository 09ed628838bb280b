"""SCRAM's client side (RFC 5802), for this broker's connections to the others and for
tests: `first_message`, then `final_message(server_first)`, then `verify(server_final)`."""

from __future__ import annotations

import base64
import hmac
import re
import secrets

from tierbroker.broker.security.sasl.scram import ScramMechanism, username_to_sasl_name, xor

GS2_HEADER = "n,,"
_SERVER_FIRST = re.compile(r"r=(?P<nonce>[^,]+),s=(?P<salt>[^,]+),i=(?P<iterations>\d+)(?:,.*)?")


class ScramError(Exception):
    """The server's messages are not what SCRAM expects, or it could not prove itself."""


class ScramSaslClient:
    def __init__(self, mechanism: ScramMechanism, username: str, password: str) -> None:
        self._scram = mechanism
        self._password = password
        self._nonce = secrets.token_urlsafe(24)
        self._client_first_bare = f"n={username_to_sasl_name(username)},r={self._nonce}"
        self._server_signature = b""

    def first_message(self) -> bytes:
        return (GS2_HEADER + self._client_first_bare).encode()

    def final_message(self, server_first: bytes) -> bytes:
        match = _SERVER_FIRST.fullmatch(server_first.decode("utf-8", errors="replace"))
        if match is None or not match["nonce"].startswith(self._nonce):
            raise ScramError(f"invalid server first message: {server_first!r}")
        iterations = int(match["iterations"])
        salted = self._scram.salted_password(
            self._password, base64.b64decode(match["salt"]), iterations
        )
        client_key = self._scram.client_key(salted)
        channel = base64.b64encode(GS2_HEADER.encode()).decode()
        without_proof = f"c={channel},r={match['nonce']}"
        auth_message = f"{self._client_first_bare},{server_first.decode()},{without_proof}"
        signature = self._scram.hmac(self._scram.hash(client_key), auth_message.encode())
        proof = base64.b64encode(xor(client_key, signature)).decode()
        self._server_signature = self._scram.hmac(
            self._scram.server_key(salted), auth_message.encode()
        )
        return f"{without_proof},p={proof}".encode()

    def verify(self, server_final: bytes) -> None:
        expected = b"v=" + base64.b64encode(self._server_signature)
        if not self._server_signature or not hmac.compare_digest(server_final, expected):
            raise ScramError("the server's signature does not match: it does not hold our key")
