"""`max.connections` holds new connections in the listen backlog until one closes, as Kafka's
acceptor does, and so does the open file limit less what the logs need; the overrides string
of `max.connections.per.ip.overrides` is parsed strictly."""

from __future__ import annotations

import asyncio
import struct

import pytest

from tierbroker.broker.config.broker_config import load_config
from tierbroker.broker.config.connection_limits import (
    ConnectionLimits,
    connections_within_file_limit,
    parse_per_ip_overrides,
)
from tierbroker.broker.network.socket_server import SocketServer
from tierbroker.storage.file_cache import log_file_capacity, soft_file_limit


async def pong(frame: bytes | memoryview, peer: str) -> list[bytes]:
    return [struct.pack(">i", 4) + b"pong"]


async def ping(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, wait_s: float) -> bool:
    writer.write(struct.pack(">i", 4) + b"ping")
    try:
        return await asyncio.wait_for(reader.readexactly(8), wait_s) == b"\0\0\0\4pong"
    except TimeoutError:
        return False


async def test_at_max_connections_the_broker_stops_accepting_until_one_closes() -> None:
    server = SocketServer(pong, 1024, 1 << 20, ConnectionLimits(max_connections=2))
    server.listen("127.0.0.1", 0)
    await server.start()
    try:
        first, second, third = [
            await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)
        ]
        assert await ping(*first, wait_s=10) and await ping(*second, wait_s=10)
        assert not await ping(*third, wait_s=0.5)  # connected in the backlog, not accepted
        assert server.quotas.total == 2
        first[1].close()
        assert await asyncio.wait_for(third[0].readexactly(8), 10) == b"\0\0\0\4pong"
        for _, writer in (second, third):
            writer.close()
    finally:
        await server.stop(1)


def test_per_ip_overrides_are_address_count_pairs() -> None:
    assert parse_per_ip_overrides("127.0.0.1:5, [::1]:2,") == {"127.0.0.1": 5, "::1": 2}
    with pytest.raises(ValueError, match="address:count"):
        parse_per_ip_overrides("127.0.0.1")


async def test_short_of_the_file_limit_the_broker_stops_accepting_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = ConnectionLimits(max_connections=10, max_connections_by_file_limit=1)
    server = SocketServer(pong, 1024, 1 << 20, limits)
    server.listen("127.0.0.1", 0)
    await server.start()
    try:
        first, second, third = [
            await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)
        ]
        assert await ping(*first, wait_s=10)
        assert not await ping(*second, wait_s=0.5)  # connected in the backlog, not accepted
        first[1].close()
        assert await asyncio.wait_for(second[0].readexactly(8), 10) == b"\0\0\0\4pong"
        second[1].close()
        assert await ping(*third, wait_s=10)
        third[1].close()
    finally:
        await server.stop(1)
    said = [r.getMessage() for r in caplog.records if "not accepting" in r.getMessage()]
    assert len(said) == 1 and "open file limit" in said[0], said


def test_max_connections_defaults_below_the_open_file_limit() -> None:
    limits = load_config(None, []).connection_limits
    assert limits.max_connections == limits.max_connections_by_file_limit
    assert limits.max_connections == connections_within_file_limit()
    assert limits.max_connections <= soft_file_limit() - log_file_capacity()
