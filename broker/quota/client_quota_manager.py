"""`ClientQuotaManager`: one kind of client quota (produce bytes, fetch bytes, request
time), each client's rate of it, and how long a client over its quota is throttled.

As Kafka's `ClientQuotaManager`: a value is recorded in the rate of the entity the
client's quota comes from (`ClientQuotas.resolve`: clients of one named entity share a
rate, those of a default entity have one each), and if the rate is then above the quota
the client is throttled for as long as it takes the rate to fall back to it
(`throttle_time_ms`), at most `max_throttle_ms`. Clients without a quota of this kind
are not recorded at all. A rate no one records in for an hour is dropped, as Kafka
expires its sensors. Not thread-safe: used on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tierbroker.broker.quota.entity import ClientQuotas
from tierbroker.broker.quota.rate import QuotaWindow, SampledRate, throttle_time_ms

INACTIVE_RATE_MS = 3_600_000
_SWEEP_EVERY_MS = 60_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ClientQuotaManager:
    def __init__(
        self,
        key: str,
        quotas: Callable[[], ClientQuotas],
        window: QuotaWindow,
        max_throttle_ms: int | None = None,
    ) -> None:
        self.key = key  # producer_byte_rate, consumer_byte_rate, request_percentage
        self.quotas = quotas
        self.window = window
        self.max_throttle_ms = max_throttle_ms
        self._rates: dict[tuple[str, str], SampledRate] = {}
        self._swept_ms = 0

    def applies(self, user: str, client_id: str) -> bool:
        """Whether this client has a quota of this kind."""
        return self.quotas().resolve(self.key, user, client_id) is not None

    def max_value_in_window(self, user: str, client_id: str) -> float | None:
        """The most one request may record without being throttled for sure (Kafka's
        `getMaxValueInQuotaWindow`): a fetch asks no more bytes; None without a quota."""
        resolved = self.quotas().resolve(self.key, user, client_id)
        if resolved is None:
            return None
        return resolved.bound * (self.window.samples - 1) * self.window.window_ms / 1000

    def record(self, user: str, client_id: str, value: float, now_ms: int | None = None) -> int:
        """Record `value` for the client; the milliseconds to throttle it (0: within quota)."""
        resolved = self.quotas().resolve(self.key, user, client_id)
        if resolved is None:
            return 0
        now_ms = monotonic_ms() if now_ms is None else now_ms
        rate = self._rate(resolved.tags, now_ms)
        rate.record(value, now_ms)
        measured = rate.measure(now_ms)
        if measured <= resolved.bound:
            return 0
        throttle_ms = throttle_time_ms(measured, resolved.bound, rate.window_size_ms(now_ms))
        if self.max_throttle_ms is not None:
            throttle_ms = min(throttle_ms, self.max_throttle_ms)
        return throttle_ms

    def unrecord(self, user: str, client_id: str, value: float, now_ms: int | None = None) -> None:
        """Take back a value recorded for a response that was not sent (a throttled
        fetch is answered empty), as Kafka's `unrecordQuotaSensor`."""
        resolved = self.quotas().resolve(self.key, user, client_id)
        if resolved is not None and (rate := self._rates.get(resolved.tags)) is not None:
            rate.record(-value, monotonic_ms() if now_ms is None else now_ms)

    def _rate(self, tags: tuple[str, str], now_ms: int) -> SampledRate:
        if now_ms - self._swept_ms >= _SWEEP_EVERY_MS:
            self._swept_ms = now_ms
            for idle in [
                t for t, r in self._rates.items() if now_ms - r.idle_since_ms() > INACTIVE_RATE_MS
            ]:
                del self._rates[idle]
        rate = self._rates.get(tags)
        if rate is None:
            rate = self._rates[tags] = SampledRate(self.window)
        return rate
