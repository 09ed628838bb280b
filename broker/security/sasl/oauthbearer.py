"""OAUTHBEARER (RFC 7628) as Kafka's OAuthBearerSaslServer, with Kafka's unsecured JWS
validator (OAuthBearerUnsecuredJws; for tests: alg `none`, no signature).

    client-first  n,[a=<authzid>],\x01auth=Bearer <token>\x01[<key>=<value>\x01...]\x01

A valid token completes the exchange with an empty challenge and the session ends no later
than the token's `exp` (KIP-368). An invalid one is answered with a JSON error
(`{"status":"invalid_token"}`); the client's `\x01` that follows ends the exchange in
failure with that message.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tierbroker.broker.security.sasl.mechanism import (
    OAUTHBEARER,
    IllegalSaslStateError,
    InvalidCredentialsError,
    SaslAuthenticationError,
)
from tierbroker.broker.security.sasl.scram import sasl_name_to_username

_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_KVPAIRS = r"(?:[A-Za-z]+=[\x21-\x7e \t\r\n]+\x01)*"
_CLIENT_FIRST = re.compile(rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,\x01(?P<kvpairs>{_KVPAIRS})\x01")
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_.a-zA-Z0-9]+)")
CONTROL_A = b"\x01"


class InvalidTokenError(Exception):
    """The token is not valid; the message goes to the broker's log, not to the client."""


@dataclass(frozen=True, slots=True)
class ValidToken:
    principal_name: str
    expiry_ms: int  # the token's `exp`, in ms


class TokenValidator(Protocol):
    async def validate(self, token: str) -> ValidToken:
        """The token's principal and expiry; raises InvalidTokenError."""


@dataclass(frozen=True, slots=True)
class UnsecuredJwsValidator:
    """Kafka's OAuthBearerUnsecuredValidatorCallbackHandler, with its JAAS options
    `unsecuredValidatorPrincipalClaimName` (sub), `...ScopeClaimName` (scope),
    `...RequiredScope` (space-separated) and `...AllowableClockSkewMs` (0)."""

    principal_claim_name: str = "sub"
    scope_claim_name: str = "scope"
    required_scope: tuple[str, ...] = ()
    allowable_clock_skew_ms: int = 0

    @classmethod
    def from_jaas_options(cls, options: Mapping[str, str]) -> UnsecuredJwsValidator:
        prefix = "unsecuredValidator"
        return cls(
            principal_claim_name=options.get(prefix + "PrincipalClaimName", "sub").strip(),
            scope_claim_name=options.get(prefix + "ScopeClaimName", "scope").strip(),
            required_scope=tuple(options.get(prefix + "RequiredScope", "").split()),
            allowable_clock_skew_ms=int(options.get(prefix + "AllowableClockSkewMs", "0")),
        )

    async def validate(self, token: str) -> ValidToken:
        if ".." in token:
            raise InvalidTokenError("Malformed compact serialization contains '..'")
        splits = token.split(".")
        if len(splits) != 3:
            raise InvalidTokenError(
                "Unsecured JWS compact serializations must have 3 dot-separated "
                "Base64URL-encoded values"
            )
        header, claims = _json_object(splits[0]), _json_object(splits[1])
        if header.get("alg") != "none":
            raise InvalidTokenError("Unsecured JWS must have 'none' for an algorithm")
        if splits[2]:
            raise InvalidTokenError("Unsecured JWS must not contain a digital signature")
        principal = claims.get(self.principal_claim_name)
        if not isinstance(principal, str) or not principal.strip():
            raise InvalidTokenError(f"No principal name in JWT claim: {self.principal_claim_name}")
        now_ms = time.time() * 1000
        exp, iat = claims.get("exp"), claims.get("iat")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            raise InvalidTokenError("No expiration time in JWT")
        if iat is not None and (not isinstance(iat, int | float) or isinstance(iat, bool)):
            raise InvalidTokenError("The iat claim had the incorrect type")
        skew = self.allowable_clock_skew_ms
        if iat is not None and iat * 1000 > now_ms + skew:
            raise InvalidTokenError(f"The Issued At value ({iat * 1000} ms) is in the future")
        if exp * 1000 <= now_ms - skew:
            raise InvalidTokenError(f"The token expired at {exp * 1000} ms")
        if iat is not None and exp <= iat:
            raise InvalidTokenError("The token's expiration time is not after its issued at time")
        scope = claims.get(self.scope_claim_name, [])
        granted = set(scope.split() if isinstance(scope, str) else scope or [])
        missing = [s for s in self.required_scope if s not in granted]
        if missing:
            raise InvalidTokenError(f"The token's scope lacks {missing}")
        return ValidToken(principal, int(exp * 1000))


class OAuthBearerSaslServer:
    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator
        self._error_message: str | None = None
        self._failure_reason: str | None = None
        self._principal = ""
        self._expiry_ms: int | None = None
        self._complete = False

    mechanism = OAUTHBEARER

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def authorization_id(self) -> str:
        return self._principal

    @property
    def credential_expiry_ms(self) -> int | None:
        return self._expiry_ms

    async def evaluate_response(self, response: bytes) -> bytes:
        if self._complete:
            raise IllegalSaslStateError("OAUTHBEARER exchange is complete")
        if response == CONTROL_A and self._error_message is not None:
            raise SaslAuthenticationError(self._error_message, self._failure_reason)
        if self._error_message is not None:
            raise IllegalSaslStateError("expected the client's %x01 after an error")
        match = _CLIENT_FIRST.fullmatch(response.decode("utf-8", errors="replace"))
        if match is None:
            raise InvalidCredentialsError("Invalid OAUTHBEARER client first message")
        pairs = dict(p.split("=", 1) for p in match["kvpairs"].split("\x01") if p)
        auth = _AUTH.fullmatch(pairs.get("auth", ""))
        if auth is None:
            raise InvalidCredentialsError("Invalid OAuth token: no auth=Bearer <token>")
        if auth["scheme"].lower() != "bearer":
            raise InvalidCredentialsError(f"Invalid scheme in OAuth token: {auth['scheme']}")
        try:
            token = await self._validator.validate(auth["token"])
        except InvalidTokenError as e:
            # As Kafka: the reason is the broker's; the client learns only the status.
            self._error_message = json.dumps({"status": "invalid_token"})
            self._failure_reason = str(e)
            return self._error_message.encode()
        authzid = match["authzid"]
        if authzid and sasl_name_to_username(authzid) != token.principal_name:
            raise SaslAuthenticationError(
                f"Authentication failed: Client requested an authorization id "
                f"({authzid}) that is different from the token's principal name "
                f"({token.principal_name})"
            )
        self._principal = token.principal_name
        self._expiry_ms = token.expiry_ms
        self._complete = True
        return b""


def _json_object(split: str) -> dict[str, Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(split + "=" * (-len(split) % 4)))
    except (binascii.Error, ValueError):
        raise InvalidTokenError("malformed Base64 URL encoded value or JSON") from None
    if not isinstance(value, dict):
        raise InvalidTokenError("malformed JSON")
    return value
