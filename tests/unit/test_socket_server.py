"""`SocketServer`: how it writes responses to the connections it accepts."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import struct
from typing import Any

import pytest

from tests.certs import session_certs
from tierbroker.broker.config.listeners import Listener, SecurityProtocol
from tierbroker.broker.network.socket_server import (
    WRITE_SLICE_BYTES,
    ListenerSecurity,
    SocketServer,
)

MIB = 1 << 20


async def test_a_large_part_waits_for_the_client_a_slice_at_a_time_and_arrives_whole() -> None:
    payload = os.urandom(16 * MIB)

    async def handler(frame: bytes | memoryview, peer: str) -> list[bytes]:
        return [struct.pack(">i", len(payload)), payload]

    server = SocketServer(handler, max_request_bytes=MIB, max_queued_bytes=MIB)
    server.listen("127.0.0.1", 0)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(struct.pack(">i", 4) + b"ping")
        # The client reads no more than its stream's buffer: the sockets fill up, and
        # the server's transport holds at most one slice of what is left, besides what it
        # held when the slice was written (below its high-water mark, or it would wait).
        for _ in range(100):
            await asyncio.sleep(0.02)
            (connection,) = server.connections or (None,)
            if connection is not None and connection.transport is not None:
                if connection.transport.get_write_buffer_size() > 0:
                    break
        await asyncio.sleep(0.2)
        assert connection is not None and connection.transport is not None
        _, high_water = connection.transport.get_write_buffer_limits()
        assert 0 < connection.transport.get_write_buffer_size() <= high_water + WRITE_SLICE_BYTES
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        assert size == len(payload) and await reader.readexactly(size) == payload
        writer.close()
    finally:
        await server.stop(1)


async def test_accepted_connections_send_small_parts_without_waiting_for_an_ack() -> None:
    """A response header written before a sendfile must not sit in Nagle's buffer."""

    async def handler(frame: bytes | memoryview, peer: str) -> list[bytes]:
        return [struct.pack(">i", 4), b"pong"]

    server = SocketServer(handler, max_request_bytes=MIB, max_queued_bytes=MIB)
    server.listen("127.0.0.1", 0)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(struct.pack(">i", 4) + b"ping")
        assert await reader.readexactly(8) == struct.pack(">i", 4) + b"pong"
        (connection,) = server.connections
        assert connection.transport is not None
        sock = connection.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        writer.close()
    finally:
        await server.stop(1)


async def test_a_client_gone_mid_handshake_is_a_failed_authentication_with_a_reason() -> None:
    """asyncio's error for it has no message: the log line names its type instead."""
    certs = session_certs()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.broker.cert, certs.broker.key)

    async def handler(frame: bytes | memoryview, peer: str) -> list[bytes]:
        raise AssertionError("no request gets through")

    server = SocketServer(
        handler,
        max_request_bytes=MIB,
        max_queued_bytes=MIB,
        security=ListenerSecurity(ssl_context_for=lambda _listener: context),
    )
    sock = socket.create_server(("127.0.0.1", 0))
    server.listen_on(sock, Listener("SSL", SecurityProtocol.SSL, "127.0.0.1", server_port(sock)))
    failures = Recorder()
    metrics_log = logging.getLogger("tierbroker.broker.network.socket_server_metrics")
    metrics_log.addHandler(failures)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"\x16\x03\x01")  # the start of a TLS record, then the end of input
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()
        async with asyncio.timeout(10):  # logged once the handshake's task has ended
            await failures.logged.wait()
        assert failures.messages[0].endswith("on listener SSL: TLS handshake: ConnectionResetError")
    finally:
        metrics_log.removeHandler(failures)
        await server.stop(1)


class Recorder(logging.Handler):
    """The messages of the records it handles, and an event set at the first."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.logged = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.logged.set()


def server_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


async def test_a_throttled_connection_is_answered_then_muted() -> None:
    """KIP-219: the response goes out at once; then nothing more is read or handled from
    the client until the throttle time has passed (or the server stops)."""
    handled: list[bytes] = []

    async def handler(frame: bytes | memoryview, connection: Any) -> list[bytes]:
        handled.append(bytes(frame))
        connection.mute_after_response(600_000)
        return [struct.pack(">i", 4), b"pong"]

    server = SocketServer(handler, max_request_bytes=MIB, max_queued_bytes=MIB)
    server.listen("127.0.0.1", 0)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(struct.pack(">i", 3) + b"one" + struct.pack(">i", 3) + b"two")
        assert await reader.readexactly(8) == struct.pack(">i", 4) + b"pong"
        (connection,) = server.connections
        assert connection.transport is not None and not connection.transport.is_reading()
        await asyncio.sleep(0.1)  # the loop runs on; the second request waits for the mute
        assert handled == [b"one"]
        writer.close()
    finally:
        await server.stop(30)  # the mute ends with the server, not after ten minutes


async def test_stop_cancels_a_request_whose_client_has_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler still waiting when its client disconnected is no connection's any more:
    stopping the server cancels it, rather than leaving it to outlive the server."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(frame: bytes | memoryview, connection: Any) -> list[bytes]:
        started.set()
        try:
            await asyncio.Event().wait()  # a wait nothing ends
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return []

    server = SocketServer(handler, max_request_bytes=MIB, max_queued_bytes=MIB)
    lost = asyncio.Event()
    closed = server.connection_closed

    def connection_closed(connection: Any) -> None:
        closed(connection)
        lost.set()

    monkeypatch.setattr(server, "connection_closed", connection_closed)
    server.listen("127.0.0.1", 0)
    await server.start()
    client = socket.create_connection(("127.0.0.1", server.port))
    client.sendall(struct.pack(">i", 4) + b"ping")
    await started.wait()
    # A reset, not an EOF: the transport is lost at once (as a TLS one is at EOF).
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
    async with asyncio.timeout(10):
        await lost.wait()
        await server.stop(1)
    assert cancelled.is_set()
