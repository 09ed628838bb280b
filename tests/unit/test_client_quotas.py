"""Client quotas: Kafka's sampled rate and throttle time, the order of precedence of
quota entities, and a manager's rates per entity."""

from __future__ import annotations

import asyncio

import pytest

from tierbroker.broker.quota import request_time
from tierbroker.broker.quota.client_quota_manager import ClientQuotaManager
from tierbroker.broker.quota.entity import (
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    ClientQuotas,
    QuotaEntity,
    desanitize,
    precedence,
    sanitize,
)
from tierbroker.broker.quota.rate import QuotaWindow, SampledRate, throttle_time_ms
from tierbroker.broker.quota.request_time import LoopTime

WINDOW = QuotaWindow(samples=11, window_ms=1000)


def test_a_first_burst_is_measured_over_ten_windows_at_least() -> None:
    rate = SampledRate(WINDOW)
    rate.record(1000, now_ms=0)
    # As Kafka's Rate: samples - 1 whole windows at least, not the 1 ms elapsed.
    assert rate.window_size_ms(1) == 10_001
    assert rate.measure(1) == pytest.approx(1000 / 10.001)


def test_the_rate_is_over_the_windows_kept_and_forgets_older_values() -> None:
    rate = SampledRate(WINDOW)
    for second in range(30):
        rate.record(100, now_ms=second * 1000)
    # The samples of the last 11 s (seconds 19 to 29), over the 10 s since the oldest began.
    assert rate.measure(29_000) == pytest.approx(1100 / 10)
    # Silence for longer than all the windows: every sample is reset.
    assert rate.measure(29_000 + 11_000) == 0


def test_a_negative_value_takes_back_what_was_recorded() -> None:
    rate = SampledRate(WINDOW)
    rate.record(5000, now_ms=0)
    rate.record(-5000, now_ms=10)
    assert rate.measure(10) == 0


def test_throttle_time_brings_the_rate_back_to_the_quota() -> None:
    # O * W / (W + X) = T: twice the quota over 10 s waits another 10 s.
    assert throttle_time_ms(200, 100, 10_000) == 10_000
    assert throttle_time_ms(100, 100, 10_000) == 0
    assert throttle_time_ms(50, 100, 10_000) == 0
    assert throttle_time_ms(100.5, 100, 1000) == 5  # half up, as Java's Math.round


def test_precedence_is_kafkas() -> None:
    assert list(precedence("alice", "app")) == [
        QuotaEntity("alice", "app"),
        QuotaEntity("alice", DEFAULT),
        QuotaEntity("alice"),
        QuotaEntity(DEFAULT, "app"),
        QuotaEntity(DEFAULT, DEFAULT),
        QuotaEntity(DEFAULT),
        QuotaEntity(None, "app"),
        QuotaEntity(None, DEFAULT),
    ]
    # No client id: only the user entities can match, as in Kafka's lookup.
    assert list(precedence("alice", "")) == [QuotaEntity("alice"), QuotaEntity(DEFAULT)]


def test_the_first_entity_setting_the_kind_wins() -> None:
    quotas = ClientQuotas(
        {
            QuotaEntity(None, DEFAULT): {PRODUCER_BYTE_RATE: 1.0, CONSUMER_BYTE_RATE: 2.0},
            QuotaEntity(DEFAULT): {PRODUCER_BYTE_RATE: 3.0},
            QuotaEntity("alice", "app"): {CONSUMER_BYTE_RATE: 4.0},
        }
    )
    produce = quotas.resolve(PRODUCER_BYTE_RATE, "alice", "app")
    assert produce is not None and produce.bound == 3.0
    assert produce.tags == ("alice", "")  # users/<default>: alice's own rate
    fetch = quotas.resolve(CONSUMER_BYTE_RATE, "alice", "app")
    assert fetch is not None and (fetch.bound, fetch.tags) == (4.0, ("alice", "app"))
    other = quotas.resolve(CONSUMER_BYTE_RATE, "bob", "tool")
    assert other is not None and (other.bound, other.tags) == (2.0, ("", "tool"))
    assert ClientQuotas().resolve(PRODUCER_BYTE_RATE, "alice", "app") is None


def test_names_are_sanitized_as_kafka_does() -> None:
    assert sanitize("CN=Alice Smith,O=Example*") == "CN%3DAlice%20Smith%2CO%3DExample%2A"
    assert sanitize("a-b_c.d~e") == "a-b_c.d~e"
    assert desanitize(sanitize("user@example.com/x y")) == "user@example.com/x y"


def _manager(quotas: ClientQuotas, key: str = PRODUCER_BYTE_RATE) -> ClientQuotaManager:
    return ClientQuotaManager(key, lambda: quotas, WINDOW)


def test_a_client_over_its_quota_is_throttled_for_the_excess() -> None:
    manager = _manager(ClientQuotas({QuotaEntity(None, "app"): {PRODUCER_BYTE_RATE: 1000.0}}))
    # 10,000 bytes in the first window: 1,000 B/s over 10 s, just within.
    assert manager.record("ANONYMOUS", "app", 10_000, now_ms=0) == 0
    # 10,000 more: 2,000 B/s over the 10 s window, another 10 s to wait.
    assert manager.record("ANONYMOUS", "app", 10_000, now_ms=0) == 10_000
    # Another client id has no quota: never throttled, never recorded.
    assert manager.record("ANONYMOUS", "other", 10**9, now_ms=0) == 0


def test_a_named_entity_is_one_rate_and_a_default_one_each() -> None:
    shared = _manager(ClientQuotas({QuotaEntity("alice"): {PRODUCER_BYTE_RATE: 1000.0}}))
    assert shared.record("alice", "one", 10_000, now_ms=0) == 0
    assert shared.record("alice", "two", 10_000, now_ms=0) > 0  # alice's clients together
    each = _manager(ClientQuotas({QuotaEntity(None, DEFAULT): {PRODUCER_BYTE_RATE: 1000.0}}))
    assert each.record("alice", "one", 10_000, now_ms=0) == 0
    assert each.record("alice", "two", 10_000, now_ms=0) == 0  # a rate of its own


def test_a_quota_change_applies_to_the_rate_kept() -> None:
    quotas = ClientQuotas({QuotaEntity(None, "app"): {PRODUCER_BYTE_RATE: 1000.0}})
    manager = ClientQuotaManager(PRODUCER_BYTE_RATE, lambda: quotas, WINDOW)
    assert manager.record("u", "app", 10_000, now_ms=0) == 0
    quotas = quotas.with_entity(QuotaEntity(None, "app"), {PRODUCER_BYTE_RATE: 500.0})
    assert manager.record("u", "app", 1, now_ms=1) > 0
    quotas = quotas.with_entity(QuotaEntity(None, "app"), {})
    assert manager.record("u", "app", 10**9, now_ms=2) == 0


def test_unrecord_gives_back_a_throttled_fetch() -> None:
    manager = _manager(
        ClientQuotas({QuotaEntity(None, "c"): {CONSUMER_BYTE_RATE: 1000.0}}), CONSUMER_BYTE_RATE
    )
    throttle_ms = manager.record("u", "c", 50_000, now_ms=0)
    assert throttle_ms > 0
    manager.unrecord("u", "c", 50_000, now_ms=0)
    assert manager.record("u", "c", 5_000, now_ms=1) == 0


def test_the_request_quota_caps_its_throttle_at_one_window() -> None:
    quotas = ClientQuotas({QuotaEntity(None, "c"): {"request_percentage": 1.0}})
    manager = ClientQuotaManager("request_percentage", lambda: quotas, WINDOW, WINDOW.window_ms)
    assert manager.record("u", "c", 10_000.0, now_ms=0) == WINDOW.window_ms


async def test_loop_time_counts_the_steps_not_the_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [0]  # a fake perf_counter_ns: each party advances it by what it "spends"
    monkeypatch.setattr(request_time.time, "perf_counter_ns", lambda: clock[0])
    resumed = asyncio.Event()

    async def handler() -> str:
        clock[0] += 20_000_000  # 20 ms of the request's own work
        await resumed.wait()
        clock[0] += 30_000_000
        return "done"

    async def other_work() -> None:
        clock[0] += 1_000_000_000  # a second of other tasks while the request waits
        resumed.set()

    timed = LoopTime(handler())
    results = await asyncio.gather(timed, other_work())
    assert results[0] == "done"
    assert timed.busy_ns == 50_000_000
    assert timed.percent_seconds == pytest.approx(5.0)  # 50 ms: 5% of a thread for a second


async def test_loop_time_passes_a_cancellation_on() -> None:
    started = asyncio.Event()
    cleaned = []

    async def handler() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(True)

    task = asyncio.ensure_future(LoopTime(handler()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]
