"""Size prefixes cannot make a real broker allocate more than `queued.max.request.bytes`."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from tests.integration.broker_process import BrokerProcess, api_versions_answered

MIB = 1 << 20
POOL_BYTES = 16 * MIB
FRAME_BYTES = 12 * MIB
CONNECTIONS = 10


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def test_big_size_prefixes_hold_at_most_the_pool_and_muted_requests_are_served_later(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(
        tmp_path,
        {"queued.max.request.bytes": str(POOL_BYTES), "socket.request.max.bytes": str(100 * MIB)},
    ).start()
    assert broker.process is not None
    rss_before = rss_bytes(broker.process.pid)
    # ApiVersions v0 padded to FRAME_BYTES: Kafka ignores bytes after the request.
    request = struct.pack(">hhih", 18, 0, 7, 4) + b"test"
    frame = struct.pack(">i", FRAME_BYTES) + request + bytes(FRAME_BYTES - len(request))
    clients = [
        socket.create_connection(("127.0.0.1", broker.port), timeout=10) for _ in range(CONNECTIONS)
    ]
    try:
        for client in clients:
            client.sendall(frame[:6])
        assert api_versions_answered(broker.port, timeout_s=10)
        grown = rss_bytes(broker.process.pid) - rss_before
        assert grown < POOL_BYTES + 8 * MIB, f"RSS grew by {grown} bytes"

        *others, last = clients
        for client in others:
            client.close()
        last.sendall(frame[6:])
        (size,) = struct.unpack(">i", last.recv(4))
        assert size > 4 and last.recv(4) == struct.pack(">i", 7)
    finally:
        for client in clients:
            client.close()
    assert broker.stop() == 0
    assert "Traceback" not in broker.log(), broker.log()
