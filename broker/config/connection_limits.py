"""Kafka's connection quotas as configured: `max.connections` (by default what the open
file limit leaves), `max.connections.per.ip` and its overrides, the idle timeout."""

from __future__ import annotations

from dataclasses import dataclass, field

from tierbroker.storage.file_cache import log_file_capacity, soft_file_limit

# Descriptors besides the log file cache's: index files opened by rolls and loading,
# snapshots, checkpoints, the remote tier's copies and reads, sockets to other brokers
# and ZooKeeper, the interpreter's own files.
RESERVED_FILES = 128
MIN_CONNECTIONS_WITHIN_FILE_LIMIT = 16


def connections_within_file_limit() -> int:
    """The connections the open file limit leaves once the logs and the rest have theirs."""
    reserve = log_file_capacity() + RESERVED_FILES
    return max(MIN_CONNECTIONS_WITHIN_FILE_LIMIT, soft_file_limit() - reserve)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """Kafka's connection quotas and idle timeout; Kafka's defaults, but for
    `max.connections` (what the open file limit leaves, as `max_connections_by_file_limit`)."""

    max_connections: int = 2**31 - 1
    max_connections_by_file_limit: int = 2**31 - 1
    max_connections_per_ip: int = 2**31 - 1
    max_connections_per_ip_overrides: dict[str, int] = field(default_factory=dict)
    connections_max_idle_ms: int = 600_000

    @property
    def ssl_handshake_timeout_s(self) -> float:
        """A TLS handshake is bounded as an idle connection is, and by asyncio's 60 s."""
        return min(60.0, self.connections_max_idle_ms / 1000)

    def limit_for(self, ip: str) -> int:
        return self.max_connections_per_ip_overrides.get(ip, self.max_connections_per_ip)


def parse_per_ip_overrides(text: str) -> dict[str, int]:
    """`max.connections.per.ip.overrides`: `address:count` pairs, comma separated."""
    overrides: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        address, sep, count = item.rpartition(":")
        if not sep or not address or not count.strip().isdigit():
            raise ValueError(f"expected address:count, got {item!r}")
        overrides[address.strip().strip("[]")] = int(count)
    return overrides
