"""What a `TierbrokerCluster` reports, shared by its blocking and its coroutine helpers."""

from __future__ import annotations

from dataclasses import dataclass, field

from tierbroker.testing.clients import Record

ConfigValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int
    rack: str | None
    metrics_url: str | None  # the Prometheus endpoint (`/metrics`, `/tier/status`)
    running: bool

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionTier:
    """One partition's tiers, as its leader sees them (`tierbroker tier status`)."""

    partition: int
    leader: int
    log_start_offset: int
    local_log_start_offset: int
    log_end_offset: int
    local_segments: int
    local_bytes: int
    remote_segments: int
    remote_bytes: int
    remote_log_start_offset: int  # -1: nothing in the remote tier
    remote_log_end_offset: int  # -1: nothing copied yet
    copy_lag_segments: int  # rolled segments not copied yet
    copy_lag_bytes: int


@dataclass
class Produced:
    """What `assert_produces` saw: the new records, in partition and offset order."""

    records: list[Record] = field(default_factory=list)

    @property
    def values(self) -> list[bytes | None]:
        return [r.value for r in self.records]
