"""`BrokerClient`: one connection from this broker to another, for requests of its own.

Followers fetch from leaders through it, and internal writers (the remote-log metadata
manager, producer-id and coordinator work) send requests to other brokers. It connects
on first use, asks the peer's ApiVersions once per connection and sends each API at the
highest version both sides know. Requests may be pipelined; responses are matched by
correlation id. When the connection fails or is closed, every waiting request fails
with `BrokerUnavailable` (the reader task never leaves a waiter behind); the next request
reconnects.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from typing import Any

from tierbroker.protocol.client_codec import (
    API_VERSIONS,
    decode_response,
    encode_request,
    request_type,
    response_correlation_id,
)
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.versions import SUPPORTED_VERSIONS

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 256 * 1024 * 1024  # a bound on what one response may make us allocate
# The stream reader pauses the socket above twice its limit: at asyncio's 64 KiB default, a
# fetch response of several MiB would pause and resume it dozens of times.
_READ_LIMIT_BYTES = 8 * 1024 * 1024


class BrokerUnavailable(ConnectionError):
    """The peer could not be reached, or the connection broke before it answered."""


class BrokerClient:
    """Not shared between event loops; any number of tasks of one loop may use it."""

    def __init__(
        self, host: str, port: int, client_id: str, request_timeout_ms: int = 30_000
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self._correlation_ids = itertools.count()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._waiting: dict[int, tuple[int, int, asyncio.Future[Any]]] = {}
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
            if self._writer is not None:
                return
            if self._closed:
                raise BrokerUnavailable(f"{self}: closed")
            try:
                async with asyncio.timeout(self.request_timeout_ms / 1000):
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, limit=_READ_LIMIT_BYTES
                    )
            except (OSError, TimeoutError) as e:
                raise BrokerUnavailable(f"cannot connect to {self.host}:{self.port}: {e}") from e
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(
                self._read_responses(reader), name=f"broker-client-{self.host}:{self.port}"
            )
            self._versions = {API_VERSIONS: 0}
            versions = await self._send(request_type(API_VERSIONS, 0)())
            if versions.error_code != ErrorCode.none:
                await self._disconnect(BrokerUnavailable(f"{self}: ApiVersions failed"))
                raise BrokerUnavailable(f"{self}: ApiVersions answered {versions.error_code}")
            self._versions = _agree(versions.api_keys)

    async def send(self, body: Any) -> Any:
        """Send a request entity (built for `version_for` its API) and return the response."""
        await self.connect()
        return await self._send(body)

    async def _send(self, body: Any) -> Any:
        writer = self._writer
        if writer is None:
            raise BrokerUnavailable(f"{self}: not connected")
        api_key, version = int(type(body).__api_key__), int(type(body).__version__)
        correlation_id = next(self._correlation_ids) & 0x7FFFFFFF
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = (api_key, version, future)
        try:
            writer.write(encode_request(correlation_id, self.client_id, body))
            await writer.drain()
            async with asyncio.timeout(self.request_timeout_ms / 1000):
                return await asyncio.shield(future)
        except TimeoutError:
            # A peer that does not answer in time is treated as gone: start afresh.
            await self._disconnect(BrokerUnavailable(f"{self}: request timed out"))
            raise BrokerUnavailable(
                f"{self}: no answer within {self.request_timeout_ms} ms"
            ) from None
        except (ConnectionError, OSError) as e:
            await self._disconnect(BrokerUnavailable(f"{self}: {e}"))
            raise BrokerUnavailable(f"{self}: {e}") from e
        finally:
            self._waiting.pop(correlation_id, None)

    async def _read_responses(self, reader: asyncio.StreamReader) -> None:
        error: BaseException = BrokerUnavailable(f"{self}: connection closed by the peer")
        try:
            while True:
                size = _SIZE.unpack(await reader.readexactly(4))[0]
                if not 0 <= size <= MAX_RESPONSE_BYTES:
                    error = BrokerUnavailable(f"{self}: response of {size} bytes")
                    break
                frame = await reader.readexactly(size)
                waiting = self._waiting.pop(response_correlation_id(frame), None)
                if waiting is None:
                    continue  # its requester timed out and left
                api_key, version, future = waiting
                if future.done():
                    continue
                try:
                    future.set_result(decode_response(api_key, version, frame))
                except Exception as e:
                    future.set_exception(e)
        except (asyncio.IncompleteReadError, OSError) as e:
            error = BrokerUnavailable(f"{self}: {e or 'connection closed'}")
        except asyncio.CancelledError:
            error = BrokerUnavailable(f"{self}: closed")
            raise
        finally:
            self._fail_all(error)
            writer, self._writer = self._writer, None
            if writer is not None:
                writer.close()

    def _fail_all(self, error: BaseException) -> None:
        waiting, self._waiting = self._waiting, {}
        for _, _, future in waiting.values():
            if not future.done():
                future.set_exception(error)

    async def _disconnect(self, error: BaseException) -> None:
        writer, self._writer = self._writer, None
        task, self._reader_task = self._reader_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._fail_all(error)
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    async def close(self) -> None:
        """Fail waiting requests and close; idempotent."""
        self._closed = True
        await self._disconnect(BrokerUnavailable(f"{self}: closed"))


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
