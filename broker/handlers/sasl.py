"""SaslHandshake (17) and SaslAuthenticate (36): a SASL connection's frames go to its
authenticator until it is complete, as Kafka's SaslServerAuthenticator takes them before
KafkaApis does.

`admit` closes the connection on a request its authentication state does not allow; a
token after SaslHandshake v0 comes without a Kafka header (`raw_token`). A failed
handshake or authentication is answered after `connection.failed.authentication.delay.ms`
(a password guesser waits for each answer), then the connection is closed. Once
authenticated, the connection's principal is the SASL user, and its frames may be as
large as `socket.request.max.bytes` again (`sasl.server.max.receive.size` before).
On a listener without SASL both requests are answered ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

import asyncio
import datetime
import struct
from typing import Any

from tierbroker.broker.handlers.common import make, response_module
from tierbroker.broker.network.socket_server import ConnectionClosing, KafkaConnection
from tierbroker.broker.security.sasl.authenticator import (
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SaslServerAuthenticator,
)
from tierbroker.broker.security.sasl.mechanism import IllegalSaslStateError
from tierbroker.protocol.codec import Request, ResponsePart, encode_response
from tierbroker.protocol.errors import ErrorCode

API_KEYS = (SASL_HANDSHAKE, SASL_AUTHENTICATE)
_SIZE = struct.Struct(">i")


def authenticator_of(connection: KafkaConnection) -> SaslServerAuthenticator | None:
    auth = connection.authenticator
    return auth if isinstance(auth, SaslServerAuthenticator) else None


def expects_raw_token(connection: KafkaConnection) -> bool:
    auth = authenticator_of(connection)
    return auth is not None and auth.expects_raw_token


def admit(connection: KafkaConnection, api_key: int) -> None:
    """Close the connection (ConnectionClosing) unless its SASL state lets `api_key` in."""
    auth = authenticator_of(connection)
    if auth is None:
        return
    try:
        auth.admit(api_key)
    except IllegalSaslStateError as e:
        raise ConnectionClosing(f"{e} (listener {connection.listener.name})") from None


async def raw_token(connection: KafkaConnection, frame: bytes | memoryview) -> list[ResponsePart]:
    """A mechanism token after SaslHandshake v0: its challenge, size-prefixed."""
    auth = authenticator_of(connection)
    assert auth is not None
    try:
        challenge = await auth.raw_token(bytes(frame))
    except IllegalSaslStateError as e:
        await _failure_delay(auth)
        raise ConnectionClosing(str(e), last_response=[]) from None
    _maybe_authenticated(connection, auth)
    return [_SIZE.pack(len(challenge)) + challenge]


async def handle(connection: KafkaConnection, request: Request) -> list[ResponsePart]:
    """SaslHandshake or SaslAuthenticate, encoded; ConnectionClosing after a failure, with
    the answer saying why."""
    auth = authenticator_of(connection)
    m = response_module(request.api_key, request.api_version)
    if request.api_key == SASL_HANDSHAKE:
        body = _handshake(auth, request, m)
    else:
        body = await _authenticate(auth, request, m)
    response = encode_response(request.correlation_id, body)
    if auth is not None and auth.failed:
        await _failure_delay(auth)
        raise ConnectionClosing(
            f"SASL authentication failed on listener {connection.listener.name}",
            last_response=response,
        )
    if auth is not None:
        _maybe_authenticated(connection, auth)
    return response


def _handshake(auth: SaslServerAuthenticator | None, request: Request, m: Any) -> Any:
    if auth is None:
        return make(m.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state, mechanisms=())
    error = auth.handshake(request.body.mechanism, request.api_version)
    return make(m.SaslHandshakeResponse, error_code=error, mechanisms=auth.settings.mechanisms)


async def _authenticate(auth: SaslServerAuthenticator | None, request: Request, m: Any) -> Any:
    if auth is None:
        return make(
            m.SaslAuthenticateResponse,
            error_code=ErrorCode.illegal_sasl_state,
            error_message="SaslAuthenticate on a listener without SASL",
            auth_bytes=b"",
            session_lifetime=datetime.timedelta(0),
        )
    result = await auth.authenticate(request.body.auth_bytes)
    return make(
        m.SaslAuthenticateResponse,
        error_code=result.error_code,
        error_message=result.error_message,
        auth_bytes=result.auth_bytes,
        session_lifetime=datetime.timedelta(milliseconds=result.session_lifetime_ms),
    )


def _maybe_authenticated(connection: KafkaConnection, auth: SaslServerAuthenticator) -> None:
    if auth.complete and auth.principal is not None:
        connection.principal = auth.principal
        connection.reader.max_frame_bytes = connection.server.max_request_bytes


async def _failure_delay(auth: SaslServerAuthenticator) -> None:
    """Kafka's connection.failed.authentication.delay.ms: the answer to a failed
    authentication waits, bounding how fast one client can guess."""
    await asyncio.sleep(auth.settings.failed_authentication_delay_ms / 1000)
