"""`QuotaManagers`: the broker's three client quotas over one view of their configs."""

from __future__ import annotations

from dataclasses import dataclass

from tierbroker.broker.quota.client_quota_manager import ClientQuotaManager
from tierbroker.broker.quota.entity import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
)
from tierbroker.broker.quota.quota_store import ClientQuotaStore
from tierbroker.broker.quota.rate import QuotaWindow


@dataclass(frozen=True, slots=True)
class QuotaManagers:
    store: ClientQuotaStore
    produce: ClientQuotaManager  # bytes of produce requests per second
    fetch: ClientQuotaManager  # bytes of fetch responses per second (consumers only)
    request: ClientQuotaManager  # loop time, as a percentage of one thread

    @classmethod
    def create(cls, store: ClientQuotaStore, window: QuotaWindow) -> QuotaManagers:
        return cls(
            store,
            ClientQuotaManager(PRODUCER_BYTE_RATE, lambda: store.quotas, window),
            ClientQuotaManager(CONSUMER_BYTE_RATE, lambda: store.quotas, window),
            # As Kafka's ClientRequestQuotaManager: a throttle of at most one window.
            ClientQuotaManager(REQUEST_PERCENTAGE, lambda: store.quotas, window, window.window_ms),
        )
