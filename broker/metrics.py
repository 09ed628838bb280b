"""`MetricsServer`: an HTTP endpoint on `metrics.port` for Prometheus and `tierbroker tier status`.

    GET /metrics       Prometheus text format (the remote-storage metrics, per topic)
    GET /tier/status   JSON: per partition, both tiers' offsets, sizes and copy lag

A deliberately small HTTP/1.0 responder on the event loop: one request per
connection, answered and closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

_MAX_REQUEST_LINE = 8192


class MetricsServer:
    def __init__(
        self, registry: CollectorRegistry, tier_status: Callable[[], list[dict[str, Any]]]
    ) -> None:
        self.registry = registry
        self.tier_status = tier_status
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        log.info("metrics on http://%s:%d/metrics", host, port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            path = line.decode("latin-1").split(" ")[1] if line.count(b" ") >= 2 else ""
            if path == "/metrics":
                status, content_type, body = (
                    "200 OK",
                    CONTENT_TYPE_LATEST,
                    generate_latest(self.registry),
                )
            elif path.startswith("/tier/status"):
                status, content_type = "200 OK", "application/json"
                body = json.dumps(self.tier_status()).encode()
            else:
                status, content_type, body = "404 Not Found", "text/plain", b"not found\n"
            head = f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\n"
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError) as e:
            log.debug("metrics request failed: %s", e)
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
