"""SCRAM-SHA-256/512's server side (RFC 5802, Kafka's ScramSaslServer and ScramMessages).

    client-first  n,[a=<authzid>],n=<user>,r=<client nonce>[,<ext>=<value>...]
    server-first  r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
    client-final  c=<base64 gs2 header>,r=<both nonces>,p=<base64 proof>
    server-final  v=<base64 server signature>

An unknown user is answered with a made-up salt and fails only at the proof, as a wrong
password does: the exchange tells no one whether a user exists. Only the `tokenauth`
extension means anything to Kafka (delegation tokens, which tierbroker has none of: such
a login fails); other extensions are ignored.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
import secrets
from collections.abc import Callable

from tierbroker.broker.security.sasl.mechanism import (
    IllegalSaslStateError,
    InvalidCredentialsError,
    SaslAuthenticationError,
)
from tierbroker.broker.security.sasl.scram import (
    MIN_ITERATIONS,
    ScramCredential,
    ScramMechanism,
    sasl_name_to_username,
    xor,
)

# Kafka's ScramMessages grammar.
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_BASE64 = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"(?P<gs2>n,(?:a=(?P<authzid>{_SASLNAME}))?,)(?:m={_VALUE},)?"
    rf"(?P<bare>n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})(?P<extensions>{_EXTENSIONS}))"
)
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),"
    rf"p=(?P<proof>{_BASE64})"
)
TOKEN_AUTH_EXTENSION = "tokenauth"
# Made-up salts for unknown users: the same for a user each time, unknowable outside.
_UNKNOWN_USER_KEY = os.urandom(32)

CredentialLookup = Callable[[ScramMechanism, str], ScramCredential | None]


class ScramSaslServer:
    def __init__(self, mechanism: ScramMechanism, credential_of: CredentialLookup) -> None:
        self._scram = mechanism
        self._credential_of = credential_of
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._gs2_header = ""
        self._server_first = ""
        self._nonce = ""
        self._username = ""
        self._complete = False
        self._failed = False

    credential_expiry_ms = None

    @property
    def mechanism(self) -> str:
        return self._scram.mechanism_name

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def authorization_id(self) -> str:
        return self._username

    async def evaluate_response(self, response: bytes) -> bytes:
        if self._complete or self._failed:
            raise IllegalSaslStateError("Unexpected challenge in Sasl server state")
        try:
            if not self._server_first:
                return self._client_first(response)
            return self._client_final(response)
        except Exception:
            self._failed = True
            self._credential = None
            raise

    def _client_first(self, response: bytes) -> bytes:
        match = _CLIENT_FIRST.fullmatch(_text(response))
        if match is None:
            raise InvalidCredentialsError("Invalid SCRAM client first message")
        extensions = dict(e.split("=", 1) for e in match["extensions"].split(",")[1:])
        if extensions.get(TOKEN_AUTH_EXTENSION, "").lower() == "true":
            raise InvalidCredentialsError("Token Authentication failed: no delegation tokens")
        username = sasl_name_to_username(match["saslname"])
        authzid = match["authzid"]
        if authzid and sasl_name_to_username(authzid) != username:
            raise SaslAuthenticationError(
                "Authentication failed: Client requested an authorization id that is "
                "different from username"
            )
        credential = self._credential_of(self._scram, username)
        if credential is not None and credential.iterations < MIN_ITERATIONS:
            raise InvalidCredentialsError(
                f"Iterations {credential.iterations} is less than the minimum "
                f"{MIN_ITERATIONS} for {self.mechanism}"
            )
        self._username = username
        self._credential = credential
        salt, iterations = (
            (credential.salt, credential.iterations)
            if credential is not None
            else (hmac.new(_UNKNOWN_USER_KEY, username.encode(), "sha256").digest()[:16], 4096)
        )
        self._gs2_header = match["gs2"]
        self._client_first_bare = match["bare"]
        self._nonce = match["nonce"] + _server_nonce()
        salt_text = base64.b64encode(salt).decode()
        self._server_first = f"r={self._nonce},s={salt_text},i={iterations}"
        return self._server_first.encode()

    def _client_final(self, response: bytes) -> bytes:
        match = _CLIENT_FINAL.fullmatch(_text(response))
        if match is None:
            raise InvalidCredentialsError("Invalid SCRAM client final message")
        # As Kafka checks it: librdkafka 2.0 sends its own nonce again in front.
        if not match["nonce"].endswith(self._nonce):
            raise InvalidCredentialsError("Invalid client nonce in the final client message.")
        if _b64(match["channel"]) != self._gs2_header.encode():
            raise InvalidCredentialsError("Invalid channel binding in the final client message")
        credential = self._credential
        if credential is None:
            raise InvalidCredentialsError("Authentication failed: Invalid user credentials")
        auth_message = (
            f"{self._client_first_bare},{self._server_first},{match['without_proof']}"
        ).encode()
        client_signature = self._scram.hmac(credential.stored_key, auth_message)
        proof = _b64(match["proof"])
        if len(proof) != len(client_signature):
            raise InvalidCredentialsError("Invalid client credentials")
        computed_stored_key = self._scram.hash(xor(client_signature, proof))
        if not hmac.compare_digest(computed_stored_key, credential.stored_key):
            raise InvalidCredentialsError("Invalid client credentials")
        server_signature = self._scram.hmac(credential.server_key, auth_message)
        self._credential = None
        self._complete = True
        return b"v=" + base64.b64encode(server_signature)


def _server_nonce() -> str:
    return secrets.token_urlsafe(24)


def _text(response: bytes) -> str:
    try:
        return response.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidCredentialsError("SCRAM message is not UTF-8") from None


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise InvalidCredentialsError("Invalid base64 in a SCRAM message") from None
