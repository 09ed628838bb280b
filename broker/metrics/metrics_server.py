"""`MetricsServer`: an HTTP endpoint on `metrics.port` for Prometheus and the CLI
(`tierbroker tier status`, `tierbroker topic describe`).

    GET /metrics         Prometheus text format (the remote-storage metrics, per topic);
                         gauges are refreshed first, so a scrape sees the state it asks for
    GET /tier/status     JSON: per partition, both tiers' offsets, sizes and copy lag
    GET /tier/usage      JSON: per topic, this broker's object-store requests by kind and
                         bytes, the bytes its fetches served by tier and rack crossing,
                         and the remote tier's size (see `tier_usage`)
    GET /tier/health     JSON: whether the remote store works ("healthy", "unhealthy",
                         "not checked", "disabled"), the error if not, since when (ms)
    GET /cleaner/status  JSON: per compacted log hosted here, its dirty ratio (0 to 1),
                         first dirty offset, cleanable and total bytes, and whether it
                         is uncleanable

A deliberately small HTTP/1.0 responder on the event loop: one request per
connection, answered and closed. A request line or header line over 8 KiB, or
headers over 64 KiB in all, are answered 400 or 431; what the client still sends
is read and dropped, up to 1 MiB, so the answer is not lost to a reset.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

_MAX_LINE_BYTES = 8192  # a request line or one header line
_MAX_HEADER_BYTES = 65536
_MAX_DISCARD_BYTES = 1 << 20
_READ_TIMEOUT_S = 5.0


class MetricsServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        tier_status: Callable[[], list[dict[str, Any]]],
        tier_health: Callable[[], dict[str, Any]],
        cleaner_status: Callable[[], list[dict[str, Any]]],
        refresh: Callable[[], None] = lambda: None,
        *,
        tier_usage: Callable[[], dict[str, Any]] = lambda: {"topics": {}},
    ) -> None:
        """`refresh` sets the registry's gauges from current state before each scrape."""
        self.registry = registry
        self.tier_status = tier_status
        self.tier_health = tier_health
        self.cleaner_status = cleaner_status
        self.refresh = refresh
        self.tier_usage = tier_usage
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        """Serve on `host`:`port` (port 0: a free one, then in `port`)."""
        self._server = await asyncio.start_server(
            self._handle, host, port, reuse_address=True, limit=_MAX_LINE_BYTES
        )
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    async def start_on(self, sock: socket.socket) -> None:
        """Serve on `sock`, a bound TCP socket."""
        self._server = await asyncio.start_server(self._handle, sock=sock, limit=_MAX_LINE_BYTES)
        log.info("metrics on http://%s:%d/metrics", sock.getsockname()[0], self.port)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(_READ_TIMEOUT_S):
                    path = await _read_request_head(reader)
            except _BadRequest as e:
                log.info("metrics request refused: %s", e.reason)
                body = f"{e.reason}\n".encode()
                await _respond(writer, e.status, "text/plain", body)
                writer.write_eof()
                await _discard_input(reader)
                return
            await self._answer(writer, path)
        except (TimeoutError, ConnectionError) as e:
            log.debug("metrics request failed: %s", e)
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, path: str) -> None:
        if path == "/metrics":
            self.refresh()
            await _respond(writer, "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry))
        elif path.startswith("/tier/status"):
            body = json.dumps(self.tier_status()).encode()
            await _respond(writer, "200 OK", "application/json", body)
        elif path == "/tier/usage":
            body = json.dumps(self.tier_usage()).encode()
            await _respond(writer, "200 OK", "application/json", body)
        elif path == "/tier/health":
            body = json.dumps(self.tier_health()).encode()
            await _respond(writer, "200 OK", "application/json", body)
        elif path == "/cleaner/status":
            body = json.dumps(self.cleaner_status()).encode()
            await _respond(writer, "200 OK", "application/json", body)
        else:
            await _respond(writer, "404 Not Found", "text/plain", b"not found\n")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


class _BadRequest(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


async def _read_line(reader: asyncio.StreamReader, what: str, status: str) -> bytes:
    """One line of at most `_MAX_LINE_BYTES`, CRLF or LF terminated."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise _BadRequest(status, f"{what} longer than {_MAX_LINE_BYTES} bytes") from None
    except asyncio.IncompleteReadError:
        raise _BadRequest("400 Bad Request", f"connection closed in the {what}") from None


async def _read_request_head(reader: asyncio.StreamReader) -> str:
    """The path of the request; the headers are read, bounded, and ignored."""
    line = await _read_line(reader, "request line", "400 Bad Request")
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise _BadRequest("400 Bad Request", "malformed request line")
    header_bytes = 0
    while (
        header := await _read_line(reader, "header", "431 Request Header Fields Too Large")
    ).strip():
        header_bytes += len(header)
        if header_bytes > _MAX_HEADER_BYTES:
            raise _BadRequest(
                "431 Request Header Fields Too Large",
                f"headers longer than {_MAX_HEADER_BYTES} bytes",
            )
    return parts[1]


async def _respond(
    writer: asyncio.StreamWriter, status: str, content_type: str, body: bytes
) -> None:
    head = f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\n"
    writer.write(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()


async def _discard_input(reader: asyncio.StreamReader) -> None:
    """Read what the client still sends, up to a bound, so closing does not reset the
    connection (and discard our answer) while its request is unread."""
    try:
        async with asyncio.timeout(_READ_TIMEOUT_S):
            left = _MAX_DISCARD_BYTES
            while left > 0 and (chunk := await reader.read(min(left, 65536))):
                left -= len(chunk)
    except TimeoutError:
        pass
