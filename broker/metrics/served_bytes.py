"""`ServedBytesMeter`: record bytes fetch responses carried, per topic, by the tier they
came from and whether they crossed racks: what a topic's readers cost in transfer.

Consumers and followers both count: a follower's fetch from another rack crosses zones
as a consumer's does, and is billed the same. The direction compares this broker's
`broker.rack` with the consumer's Fetch `rack_id` (v11 on) or the follower broker's
registered rack: `same-rack` only when both are known and equal. A rack unknown on
either side counts as `cross-rack`, so the transfer cost shown is an upper bound and
never leaves out traffic it could not place. Counted once per partition of a response,
from the size of the range already read (a local file slice, a remote view), never
per record. On the event loop only; a topic's counts go when it is deleted (`forget`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class Tier(enum.Enum):
    LOCAL = "local"
    REMOTE = "remote"


class Direction(enum.Enum):
    SAME_RACK = "same-rack"
    CROSS_RACK = "cross-rack"


def direction(broker_rack: str | None, reader_rack: str | None) -> Direction:
    """Whether bytes this broker sends to a reader in `reader_rack` stay in its rack."""
    if broker_rack and reader_rack == broker_rack:
        return Direction.SAME_RACK
    return Direction.CROSS_RACK


class ServedBytesMeter(Collector):
    """Also the Prometheus collector of its counts: `BytesOutByTierPerSec` (counter;
    labels topic, tier, direction)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._bytes: dict[tuple[str, Tier, Direction], int] = {}
        registry.register(self)

    def served(self, topic: str, tier: Tier, to: Direction, size_bytes: int) -> None:
        key = (topic, tier, to)
        self._bytes[key] = self._bytes.get(key, 0) + size_bytes

    def usage(self) -> dict[str, dict[tuple[Tier, Direction], int]]:
        """Per topic, the bytes served by tier and direction."""
        usage: dict[str, dict[tuple[Tier, Direction], int]] = {}
        for (topic, tier, to), size in self._bytes.items():
            usage.setdefault(topic, {})[tier, to] = size
        return usage

    def forget(self, topic: str) -> None:
        for tier in Tier:
            for to in Direction:
                self._bytes.pop((topic, tier, to), None)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "BytesOutByTierPerSec",
            "Record bytes fetched by consumers and followers, by tier and rack crossing",
            labels=["topic", "tier", "direction"],
        )
        for (topic, tier, to), size in sorted(self._bytes.items(), key=_label_order):
            family.add_metric([topic, tier.value, to.value], size)
        yield family


def _label_order(item: tuple[tuple[str, Tier, Direction], int]) -> tuple[str, str, str]:
    (topic, tier, to), _ = item
    return topic, tier.value, to.value
