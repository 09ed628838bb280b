"""Memory for request frames comes from one broker-wide pool (`queued.max.request.bytes`).

A size prefix alone must not allocate its frame: connections whose frames the pool
cannot grant stop reading until memory is released, while small requests on other
connections are still answered, and a frame larger than the pool is refused.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from tierbroker.broker.network.socket_server import SocketServer
from tierbroker.protocol.framing import FrameError, FrameReader
from tierbroker.protocol.memory_pool import MemoryPool

KIB = 1 << 10
POOL_BYTES = 1024 * KIB
FRAME_BYTES = 600 * KIB


async def echo_size(frame: bytes | memoryview, peer: str) -> list[bytes]:
    return [struct.pack(">ii", 4, len(frame))]


async def answered(reader: asyncio.StreamReader) -> int:
    size, value = struct.unpack(">ii", await asyncio.wait_for(reader.readexactly(8), 10))
    assert size == 4
    return int(value)


async def until(condition: object, what: str) -> None:
    for _ in range(500):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_size_prefix_alone_allocates_nothing_beyond_the_pool() -> None:
    pool = MemoryPool(POOL_BYTES)
    readers = [FrameReader(POOL_BYTES, pool) for _ in range(10)]
    for reader in readers:
        view = reader.get_buffer()
        view[:6] = struct.pack(">i", FRAME_BYTES) + b"ab"
        del view
        assert reader.buffer_updated(6) == []
    assert pool.used_bytes == FRAME_BYTES
    assert [r.awaiting_memory_bytes for r in readers] == [0] + [FRAME_BYTES] * 9
    readers[0].close()
    assert pool.used_bytes == 0


def test_a_frame_larger_than_the_pool_is_refused() -> None:
    reader = FrameReader(4 * POOL_BYTES, MemoryPool(POOL_BYTES))
    view = reader.get_buffer()
    view[:4] = struct.pack(">i", POOL_BYTES + 1)
    del view
    with pytest.raises(FrameError, match=r"queued\.max\.request\.bytes"):
        reader.buffer_updated(4)


async def test_muted_connections_wait_for_memory_while_others_are_served() -> None:
    server = SocketServer(echo_size, max_request_bytes=POOL_BYTES, max_queued_bytes=POOL_BYTES)
    server.listen("127.0.0.1", 0)
    await server.start()
    pool = server.memory_pool
    try:
        clients = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(10)]
        for _, writer in clients:
            writer.write(struct.pack(">i", FRAME_BYTES) + b"ab")
        await until(lambda: len(muted(server)) == 9, "nine connections waiting for memory")
        assert pool.used_bytes == FRAME_BYTES

        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(struct.pack(">i", 4) + b"ping")
        assert await answered(reader) == 4  # a small request takes nothing from the pool
        writer.close()

        # The holder goes away: the first muted connection gets its memory and is served.
        by_address = {local_address(writer): (reader, writer) for reader, writer in clients}
        (holder,) = {c.peer for c in server.connections if c.reader.has_partial_frame} - muted(
            server
        )
        by_address.pop(holder)[1].close()
        await until(lambda: len(muted(server)) == 8, "the grant to the next connection")
        assert pool.used_bytes == FRAME_BYTES
        (granted,) = {c.peer for c in server.connections if c.reader.has_partial_frame} - muted(
            server
        )
        granted_reader, granted_writer = by_address[granted]
        granted_writer.write(bytes(FRAME_BYTES - 2))
        assert await answered(granted_reader) == FRAME_BYTES
        for _, writer in by_address.values():
            writer.close()
    finally:
        await server.stop(1)


def muted(server: SocketServer) -> set[str]:
    return {c.peer for c in server.connections if c.reader.awaiting_memory_bytes}


def local_address(writer: asyncio.StreamWriter) -> str:
    host, port = writer.get_extra_info("sockname")[:2]
    return f"{host}:{port}"
