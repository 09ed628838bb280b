"""The result of one timed phase, shared by the workload and the ceiling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Phase:
    """One timed phase: payload bytes and messages moved, wall time, broker CPU time."""

    messages: int
    payload_bytes: int
    seconds: float
    broker_cpu_s: float | None = None
    client_cpu_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mib_per_s(self) -> float:
        return self.payload_bytes / (1024 * 1024) / self.seconds

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds
