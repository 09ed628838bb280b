"""`QuotaManagers`: the broker's three client quotas over one view of their configs, and
what each request costs against them.

For every request of a client with a quota (Kafka's `KafkaApis`): a produce request's
size counts against `producer_byte_rate` (acks=0 too); a consumer's fetch response
against `consumer_byte_rate` (the fetch handler records it, since a throttled fetch is
answered without records); the loop time of its handling (`request_time`) against
`request_percentage`, but for ApiVersions, the SASL exchange and followers' fetches,
which Kafka exempts. The response carries the longest throttle time the request earned
and the connection is muted that long after it (`KafkaConnection.mute_after_response`).
A client without a quota costs one dict lookup per level of precedence, none when no
quota is set at all.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from typing import Any

from tierbroker.broker.network.request_context import RequestContext
from tierbroker.broker.quota.client_quota_manager import ClientQuotaManager
from tierbroker.broker.quota.entity import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
)
from tierbroker.broker.quota.quota_store import ClientQuotaStore
from tierbroker.broker.quota.rate import QuotaWindow
from tierbroker.broker.quota.request_time import LoopTime
from tierbroker.protocol.codec import Request

PRODUCE = 0
FETCH = 1
# ApiVersions: a client must be able to connect (the SASL exchange, which the dispatcher
# hands to the authenticator, never reaches the quotas).
REQUEST_TIME_EXEMPT = frozenset({18})


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

    def time_of(self, request: Request, context: RequestContext) -> bool:
        """Whether the request's loop time counts against a request quota."""
        return (
            bool(self.store.quotas)
            and request.api_key not in REQUEST_TIME_EXEMPT
            and not from_follower(request)
            and self.request.applies(context.principal.name, context.client_id)
        )

    def settle(
        self,
        request: Request,
        context: RequestContext,
        request_bytes: int,
        timed: LoopTime[Any] | None,
        body: Any,
    ) -> tuple[Any, int]:
        """Record what the handled request cost; the response with the throttle time it
        earned (the longest of its quotas'), and that time in ms."""
        if not self.store.quotas:
            return body, 0
        user, client_id = context.principal.name, context.client_id
        throttle_ms = throttle_time_of(body)
        if request.api_key == PRODUCE:
            throttle_ms = max(throttle_ms, self.produce.record(user, client_id, request_bytes))
        if timed is not None:
            spent = self.request.record(user, client_id, timed.percent_seconds)
            throttle_ms = max(throttle_ms, spent)
        if hasattr(body, "throttle_time") and throttle_ms > throttle_time_of(body):
            throttle = datetime.timedelta(milliseconds=throttle_ms)
            body = dataclasses.replace(body, throttle_time=throttle)
        return body, throttle_ms


def from_follower(request: Request) -> bool:
    """A follower's fetch: v15+ names the replica in ReplicaState, older ones in ReplicaId."""
    if request.api_key != FETCH:
        return False
    state = getattr(request.body, "replica_state", None)
    replica_id = state.replica_id if state is not None else getattr(request.body, "replica_id", -1)
    return bool(replica_id >= 0)


def throttle_time_of(body: Any) -> int:
    """The throttle time a response carries (0 without one, or no response: acks=0)."""
    throttle = getattr(body, "throttle_time", None)
    return int(throttle.total_seconds() * 1000) if throttle is not None else 0
