r"""`SaslServerAuthenticator`: one SASL connection's authentication, Kafka's state machine.

    INITIAL --ApiVersions--> HANDSHAKE --SaslHandshake--> AUTHENTICATE --> COMPLETE
       \--------------SaslHandshake-----------------/         |             |
                                                          FAILED   SaslHandshake (KIP-368)
                                                                            v
                                              COMPLETE <-- REAUTHENTICATE --> FAILED

Before authentication only ApiVersions (once) and SaslHandshake are accepted; after a
SaslHandshake v0 the client's tokens come as raw size-prefixed frames, after v1 as
SaslAuthenticate requests. Any other request is an illegal state: the connection closes.
A failure answers SASL_AUTHENTICATION_FAILED (v1) and the connection closes after
`connection.failed.authentication.delay.ms`. Once complete, a session whose lifetime
ended (`connections.max.reauth.ms`, or a token's expiry) accepts nothing but a
re-authentication, which must keep the principal.

Sans I/O: the dispatcher parses requests, asks `admit`, and sends what `handshake` and
`authenticate` return. One per connection, used by its request task only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum, auto
from typing import Protocol

from tierbroker.broker.security.principal import USER_TYPE, KafkaPrincipal
from tierbroker.broker.security.sasl.mechanism import (
    IllegalSaslStateError,
    InvalidCredentialsError,
    SaslAuthenticationError,
    SaslServer,
)
from tierbroker.broker.security.sasl.settings import SaslListenerSettings
from tierbroker.protocol.errors import ErrorCode

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


class SaslState(Enum):
    INITIAL = auto()  # ApiVersions or SaslHandshake
    HANDSHAKE = auto()  # SaslHandshake
    AUTHENTICATE = auto()  # tokens of the mechanism chosen
    COMPLETE = auto()
    REAUTHENTICATE = auto()  # tokens again, on an authenticated connection
    FAILED = auto()


class AuthenticationMetrics(Protocol):
    """Counts outcomes per listener and logs failures at a bounded rate (the socket
    server's metrics, Kafka's socket-server-metrics)."""

    def authenticated(self, listener: str, reauthentication: bool = False) -> None: ...

    def authentication_failed(
        self,
        listener: str,
        address: str,
        reason: str,
        user: str | None = None,
        reauthentication: bool = False,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class AuthenticateResult:
    error_code: ErrorCode
    error_message: str | None
    auth_bytes: bytes
    session_lifetime_ms: int


class SaslServerAuthenticator:
    def __init__(
        self,
        settings: SaslListenerSettings,
        client_address: str,
        metrics: AuthenticationMetrics,
    ) -> None:
        self.settings = settings
        self.client_address = client_address
        self._metrics = metrics
        self.state = SaslState.INITIAL
        self.principal: KafkaPrincipal | None = None
        self.handshake_version = -1
        self._server: SaslServer | None = None
        self._mechanism = ""
        self._session_expiry_ns: int | None = None

    @property
    def complete(self) -> bool:
        return self.state is SaslState.COMPLETE

    @property
    def failed(self) -> bool:
        return self.state is SaslState.FAILED

    @property
    def expects_raw_token(self) -> bool:
        """The next frame is a mechanism token with no Kafka header (SaslHandshake v0)."""
        return self.state is SaslState.AUTHENTICATE and self.handshake_version == 0

    @property
    def max_receive_bytes(self) -> int:
        """The largest frame the client may send now (`sasl.server.max.receive.size`
        before it is authenticated)."""
        return self.settings.max_receive_bytes

    def admit(self, api_key: int) -> None:
        """Whether a request of `api_key` may come now; IllegalSaslStateError if not."""
        state = self.state
        if state is SaslState.COMPLETE:
            if api_key == SASL_HANDSHAKE:
                return
            if self._session_expired():
                raise IllegalSaslStateError(
                    "the SASL session expired without re-authentication (connections.max.reauth.ms)"
                )
            if api_key == SASL_AUTHENTICATE:
                raise IllegalSaslStateError("SaslAuthenticate on an authenticated connection")
            return
        allowed = {
            SaslState.INITIAL: (API_VERSIONS, SASL_HANDSHAKE),
            SaslState.HANDSHAKE: (SASL_HANDSHAKE,),
            SaslState.AUTHENTICATE: (SASL_AUTHENTICATE,),
            SaslState.REAUTHENTICATE: (SASL_AUTHENTICATE,),
        }.get(state, ())
        if api_key not in allowed:
            during = (
                "handshake"
                if state in (SaslState.INITIAL, SaslState.HANDSHAKE)
                else "authentication"
            )
            message = f"Unexpected Kafka request of type {api_key} during SASL {during}"
            # As in Kafka, an illegal state is a failed authentication (counted, logged).
            self._fail(self._mechanism, message, state is SaslState.REAUTHENTICATE)
            raise IllegalSaslStateError(message)
        if api_key == API_VERSIONS:
            self.state = SaslState.HANDSHAKE

    def handshake(self, mechanism: str, version: int) -> ErrorCode:
        """SaslHandshake: the mechanism the client asks for; UNSUPPORTED_SASL_MECHANISM
        (then the connection closes) unless it is enabled, and for a re-authentication,
        unless it is the one the connection authenticated with."""
        reauthentication = self.state is SaslState.COMPLETE
        if mechanism not in self.settings.mechanisms or (
            reauthentication and mechanism != self._mechanism
        ):
            enabled = ", ".join(self.settings.mechanisms)
            reason = (
                f"re-authentication with {mechanism!r}, not {self._mechanism!r}"
                if reauthentication
                else f"SASL mechanism {mechanism!r} is not enabled ({enabled})"
            )
            self._fail(mechanism, reason, reauthentication)
            return ErrorCode.unsupported_sasl_mechanism
        self.handshake_version = version
        self._mechanism = mechanism
        self._server = self.settings.new_server(mechanism)
        self.state = SaslState.REAUTHENTICATE if reauthentication else SaslState.AUTHENTICATE
        return ErrorCode.none

    async def authenticate(self, token: bytes) -> AuthenticateResult:
        """SaslAuthenticate: the mechanism's challenge, or SASL_AUTHENTICATION_FAILED."""
        reauthentication = self.state is SaslState.REAUTHENTICATE
        try:
            challenge = await self._evaluate(token)
        except SaslAuthenticationError as e:
            return self._failure(ErrorCode.sasl_authentication_failed, str(e), e.reason)
        except InvalidCredentialsError as e:
            text = "re-authentication" if reauthentication else "authentication"
            message = (
                f"Authentication failed during {text} due to invalid credentials with "
                f"SASL mechanism {self._mechanism}"
            )
            return self._failure(ErrorCode.sasl_authentication_failed, message, str(e))
        except IllegalSaslStateError as e:
            return self._failure(ErrorCode.illegal_sasl_state, str(e), str(e))
        lifetime_ms = self._session_lifetime_ms() if self.complete else 0
        return AuthenticateResult(ErrorCode.none, None, challenge, lifetime_ms)

    async def raw_token(self, token: bytes) -> bytes:
        """A token after SaslHandshake v0: the challenge to send size-prefixed; raises
        IllegalSaslStateError on failure (v0 has no way to say why: the connection closes)."""
        try:
            challenge = await self._evaluate(token)
        except SaslAuthenticationError as e:
            self._fail(self._mechanism, e.reason, False)
            raise IllegalSaslStateError(f"SASL authentication failed: {e}") from None
        except InvalidCredentialsError as e:
            self._fail(self._mechanism, str(e), False)
            raise IllegalSaslStateError(f"SASL authentication failed: {e}") from None
        if self.complete:
            self._session_lifetime_ms()
        return challenge

    async def _evaluate(self, token: bytes) -> bytes:
        server = self._server
        assert server is not None, "admit lets tokens in only after a handshake"
        reauthentication = self.state is SaslState.REAUTHENTICATE
        challenge = await server.evaluate_response(token)
        if not server.complete:
            return challenge
        principal = KafkaPrincipal(USER_TYPE, server.authorization_id)
        if reauthentication and principal != self.principal:
            raise SaslAuthenticationError(
                f"Cannot change principals during re-authentication from {self.principal}: "
                f"{principal}"
            )
        self.principal = principal
        self.state = SaslState.COMPLETE
        self._metrics.authenticated(self.settings.listener, reauthentication)
        return challenge

    def _failure(self, code: ErrorCode, message: str, reason: str) -> AuthenticateResult:
        reauthentication = self.state is SaslState.REAUTHENTICATE
        self._fail(self._mechanism, reason, reauthentication)
        return AuthenticateResult(code, message, b"", 0)

    def _fail(self, mechanism: str, reason: str, reauthentication: bool) -> None:
        if self.state is SaslState.FAILED:  # a connection's failure is counted once
            return
        user = self._server.authorization_id if self._server is not None else ""
        self.state = SaslState.FAILED
        self._metrics.authentication_failed(
            self.settings.listener,
            self.client_address,
            f"{mechanism or 'SASL'}: {reason}",
            user or None,
            reauthentication,
        )

    def _session_lifetime_ms(self) -> int:
        """Kafka's calcCompletionTimesAndReturnSessionLifetimeMs: the shorter of
        `connections.max.reauth.ms` and the credential's remaining life; 0 for none."""
        server = self._server
        assert server is not None
        now_ms = int(time.time() * 1000)
        max_reauth_ms = self.settings.max_reauth_ms.get(self._mechanism, 0)
        expiry_ms = server.credential_expiry_ms
        lifetimes = [max_reauth_ms] if max_reauth_ms > 0 else []
        if expiry_ms is not None:
            lifetimes.append(max(0, expiry_ms - now_ms))
        if not lifetimes:
            self._session_expiry_ns = None
            return 0
        lifetime_ms = min(lifetimes)
        self._session_expiry_ns = time.monotonic_ns() + lifetime_ms * 1_000_000
        return lifetime_ms

    def _session_expired(self) -> bool:
        expiry = self._session_expiry_ns
        return expiry is not None and time.monotonic_ns() >= expiry
