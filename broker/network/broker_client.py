"""`BrokerClient`: one connection from this broker to another, for requests of its own.

Followers fetch from leaders through it, and internal writers (the remote-log metadata
manager, producer-id and coordinator work) send requests to other brokers. It connects
on first use, asks the peer's ApiVersions once per connection and sends each API at the
highest version both sides know. Requests may be pipelined; responses are matched by
correlation id. Responses are received straight into their frame's buffer (a buffered
protocol with the server's `FrameReader`), so the records of a fetch response are copied
once from the socket rather than through a stream's buffers; the transport callback only
hands each frame to its waiting request, which decodes it in its own task, so a large
response never stalls the event loop in one callback. An undecodable response fails its
request with `MalformedResponse`; the connection goes on (frames are length-delimited). When
the connection fails or is closed, every waiting request fails with `BrokerUnavailable`
(connection loss fails them all, so none is left behind); the next request reconnects.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from tierbroker.protocol.client_codec import (
    API_VERSIONS,
    decode_response,
    encode_request,
    request_type,
    response_correlation_id,
)
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.framing import FrameError, FrameReader, pooled_bytes
from tierbroker.protocol.memory_pool import MemoryPool
from tierbroker.protocol.versions import SUPPORTED_VERSIONS

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 256 * 1024 * 1024  # a bound on what one response may make us allocate


class BrokerUnavailable(ConnectionError):
    """The peer could not be reached, or the connection broke before it answered."""


class MalformedResponse(Exception):
    """The peer answered a frame that does not decode as the response to the request."""


class _Connection(asyncio.BufferedProtocol):
    """One connection's transport callbacks: each response frame is handed to the client as
    soon as it is whole; `lost` holds the error the connection ended with."""

    def __init__(self, client: BrokerClient) -> None:
        self.client = client
        # A frame leaves the pool as soon as it is whole: the pool just bounds a frame's size.
        self.reader = FrameReader(MAX_RESPONSE_BYTES, MemoryPool(MAX_RESPONSE_BYTES))
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None
        self.closed = asyncio.Event()
        self.can_write = asyncio.Event()
        self.can_write.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.reader.buffer_updated(nbytes)
        except FrameError as e:
            self._close(BrokerUnavailable(f"{self.client}: {e}"))
            return
        for frame in frames:
            self.reader.pool.release(pooled_bytes(len(frame)))
            self.client._answer(frame)

    def eof_received(self) -> bool | None:
        return False  # close: a peer that stops sending answers nothing more

    def connection_lost(self, exc: Exception | None) -> None:
        self.reader.close()
        if self.lost is None:
            detail = exc or "connection closed by the peer"
            self.lost = BrokerUnavailable(f"{self.client}: {detail}")
        self.can_write.set()
        self.closed.set()
        self.client._lost(self)

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def _close(self, error: BaseException) -> None:
        """Close at once, dropping unsent bytes: whatever waits fails with `error`."""
        if self.lost is None:
            self.lost = error
        if self.transport is not None:
            self.transport.abort()
        else:
            self.closed.set()


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How a connection to another broker is secured: TLS with `ssl_context` (checking the
    peer's name as `server_hostname`, or its host), then `authenticate` (SASL, sending with
    `BrokerClient.send_connected`) on each new connection, after ApiVersions."""

    ssl_context: ssl.SSLContext | None = None
    server_hostname: str | None = None
    authenticate: Callable[[BrokerClient], Awaitable[None]] | None = None


class BrokerClient:
    """Not shared between event loops; any number of tasks of one loop may use it."""

    def __init__(
        self,
        host: str,
        port: int,
        client_id: str,
        request_timeout_ms: int = 30_000,
        security: ClientSecurity | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.security = security or ClientSecurity()
        self._correlation_ids = itertools.count()
        self._connection: _Connection | None = None
        self._waiting: dict[int, asyncio.Future[bytes | memoryview]] = {}
        self._versions: dict[int, int] = {}
        self._connecting: asyncio.Lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"BrokerClient({self.host}:{self.port})"

    def version_for(self, api_key: int) -> int:
        """The version requests of `api_key` go at (call after `connect`)."""
        return self._versions[api_key]

    async def connect(self) -> None:
        """Connect and learn the peer's API versions, unless connected already."""
        async with self._connecting:
            if self._connection is not None and self._connection.lost is None:
                return
            if self._closed:
                raise BrokerUnavailable(f"{self}: closed")
            connection = _Connection(self)
            tls = self.security.ssl_context
            try:
                async with asyncio.timeout(self.request_timeout_ms / 1000):
                    await asyncio.get_running_loop().create_connection(
                        lambda: connection,
                        self.host,
                        self.port,
                        ssl=tls,
                        server_hostname=(self.security.server_hostname or self.host)
                        if tls
                        else None,
                    )
            except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
                raise BrokerUnavailable(f"cannot connect to {self.host}:{self.port}: {e}") from e
            self._connection = connection
            self._versions = {API_VERSIONS: 0}
            versions = await self._send(request_type(API_VERSIONS, 0)())
            if versions.error_code != ErrorCode.none:
                self._disconnect(BrokerUnavailable(f"{self}: ApiVersions failed"))
                raise BrokerUnavailable(f"{self}: ApiVersions answered {versions.error_code}")
            self._versions = _agree(versions.api_keys)
            if self.security.authenticate is not None:
                try:
                    await self.security.authenticate(self)
                except BaseException as e:
                    self._disconnect(BrokerUnavailable(f"{self}: authentication failed: {e}"))
                    raise

    async def send(self, body: Any) -> Any:
        """Send a request entity (built for `version_for` its API) and return the response."""
        await self.connect()
        return await self._send(body)

    async def send_connected(self, body: Any) -> Any:
        """Send on the connection being set up, without connecting: for `authenticate`."""
        return await self._send(body)

    async def _send(self, body: Any) -> Any:
        connection = self._connection
        if connection is None or connection.transport is None or connection.lost is not None:
            raise BrokerUnavailable(f"{self}: not connected")
        api_key, version = int(type(body).__api_key__), int(type(body).__version__)
        correlation_id = next(self._correlation_ids) & 0x7FFFFFFF
        future: asyncio.Future[bytes | memoryview] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        try:
            async with asyncio.timeout(self.request_timeout_ms / 1000):
                await connection.can_write.wait()
                if connection.lost is not None:
                    raise connection.lost
                # Lost but not yet told: the transport says so before `connection_lost` runs,
                # and every write meanwhile would log one of asyncio's warnings.
                if connection.transport.is_closing():
                    raise BrokerUnavailable(f"{self}: connection closed")
                connection.transport.write(encode_request(correlation_id, self.client_id, body))
                frame = await asyncio.shield(future)
        except TimeoutError:
            # A peer that does not answer in time is treated as gone: start afresh.
            self._disconnect(BrokerUnavailable(f"{self}: request timed out"))
            raise BrokerUnavailable(
                f"{self}: no answer within {self.request_timeout_ms} ms"
            ) from None
        finally:
            self._waiting.pop(correlation_id, None)
        try:
            return decode_response(api_key, version, frame)
        except Exception as e:  # any decoding failure: the peer's bytes are not the response
            raise MalformedResponse(
                f"{self}: response to api {api_key} v{version} does not decode: {e!r}"
            ) from e

    def _answer(self, frame: bytes | memoryview) -> None:
        """A response frame arrived: hand it to its waiting request, if still there."""
        future = self._waiting.pop(response_correlation_id(frame), None)
        if future is not None and not future.done():  # else its requester timed out and left
            future.set_result(frame)

    def _lost(self, connection: _Connection) -> None:
        if self._connection is connection:
            self._connection = None
        assert connection.lost is not None
        self._fail_all(connection.lost)

    def _fail_all(self, error: BaseException) -> None:
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)

    def _disconnect(self, error: BaseException) -> None:
        connection, self._connection = self._connection, None
        self._fail_all(error)
        if connection is not None:
            connection._close(error)

    async def close(self) -> None:
        """Fail waiting requests and close; idempotent."""
        self._closed = True
        connection = self._connection
        self._disconnect(BrokerUnavailable(f"{self}: closed"))
        if connection is not None:
            await connection.closed.wait()


class BrokerClients:
    """One `BrokerClient` per peer address, made on first use: a broker's own requests to
    the others (internal topics, transaction markers and checks) share its connections."""

    def __init__(
        self, client_id: str, request_timeout_ms: int, security: ClientSecurity | None = None
    ) -> None:
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.security = security
        self._clients: dict[tuple[str, int], BrokerClient] = {}

    def get(self, host: str, port: int) -> BrokerClient:
        client = self._clients.get((host, port))
        if client is None:
            client = self._clients[host, port] = BrokerClient(
                host, port, self.client_id, self.request_timeout_ms, self.security
            )
        return client

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()


def _agree(api_keys: Any) -> dict[int, int]:
    """For each API both sides know, the highest version both support."""
    agreed = {}
    for key in api_keys:
        ours = SUPPORTED_VERSIONS.get(int(key.api_key))
        if ours is None:
            continue
        low, high = max(ours[0], int(key.min_version)), min(ours[1], int(key.max_version))
        if low <= high:
            agreed[int(key.api_key)] = high
    return agreed
