"""The metrics endpoint answers an oversized or malformed request with 400 or 431 and a log
line, never a reset: what the client still sends is read and dropped before closing. Its
gauges are refreshed at each scrape; `/cleaner/status` is the cleaner's status as JSON."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from prometheus_client import CollectorRegistry, Gauge

from tierbroker.broker.metrics.metrics_server import MetricsServer


def exchange(port: int, request: bytes) -> bytes:
    """Send `request` on a raw socket and read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


CASES = {
    "long request line": (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n", b"400 Bad Request"),
    "long header": (
        b"GET /metrics HTTP/1.1\r\nX-Big: " + b"b" * 100_000 + b"\r\n\r\n",
        b"431 Request Header Fields Too Large",
    ),
    "many headers": (
        b"GET /metrics HTTP/1.1\r\n" + b"X-Header: 0123456789\r\n" * 5000 + b"\r\n",
        b"431 Request Header Fields Too Large",
    ),
    "garbage": (b"\x16\x03\x01 not http at all\r\n\r\n", b"400 Bad Request"),
}


@pytest.mark.parametrize("request_bytes, status", CASES.values(), ids=CASES.keys())
async def test_a_bad_request_is_answered_with_an_http_error(
    request_bytes: bytes, status: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    server = MetricsServer(CollectorRegistry(), lambda: [], lambda: {}, lambda: [])
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.INFO):
            answer = await asyncio.to_thread(exchange, port, request_bytes)
            assert answer.startswith(b"HTTP/1.0 " + status), answer[:200]
            good = await asyncio.to_thread(
                exchange, port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            assert good.startswith(b"HTTP/1.0 200 OK")
        assert "metrics request refused" in caplog.text
        assert "Traceback" not in caplog.text and "Unhandled exception" not in caplog.text
    finally:
        await server.stop()


async def test_gauges_are_refreshed_when_scraped() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("RemoteLogSizeBytes", "Bytes in the remote tier", ["topic"], registry=registry)
    scrapes = 0

    def refresh() -> None:
        nonlocal scrapes
        scrapes += 1
        gauge.labels("events").set(scrapes * 100)

    server = MetricsServer(registry, lambda: [], lambda: {}, lambda: [], refresh)
    await server.start("127.0.0.1", 0)
    try:
        request = b"GET /metrics HTTP/1.0\r\n\r\n"
        first = await asyncio.to_thread(exchange, server.port, request)
        second = await asyncio.to_thread(exchange, server.port, request)
    finally:
        await server.stop()
    assert b'RemoteLogSizeBytes{topic="events"} 100.0' in first
    assert b'RemoteLogSizeBytes{topic="events"} 200.0' in second


async def test_cleaner_status_is_served_as_json() -> None:
    rows = [{"topic": "users", "partition": 0, "dirty_ratio": 0.25, "uncleanable": False}]
    server = MetricsServer(CollectorRegistry(), lambda: [], lambda: {}, lambda: rows)
    await server.start("127.0.0.1", 0)
    try:
        answer = await asyncio.to_thread(
            exchange, server.port, b"GET /cleaner/status HTTP/1.0\r\n\r\n"
        )
    finally:
        await server.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK") and b"application/json" in head, head
    assert json.loads(body) == rows
