"""`BrokerLifecycle.controlled_shutdown`: bounded by its deadline and its retries, it says why
it could not move the leadership instead of waiting on an unreachable store. On a
virtual clock, so the attempts' times are exact."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tests.unit import virtual_time
from tierbroker.broker.metadata.store import ConnectionLossError, SessionState
from tierbroker.broker.server.broker_lifecycle import BrokerLifecycle

BROKER = 1


class Cache:
    """Broker 1 leads one partition that broker 2 (in sync) could lead, until `move()`."""

    def __init__(self) -> None:
        self.brokers = {1: None, 2: None}
        self.states = {("t", 0): SimpleNamespace(leader=BROKER, isr=[1, 2])}
        self._changed = asyncio.Event()

    def move(self) -> None:
        self.states[("t", 0)].leader = 2
        self._changed.set()

    async def wait_until(self, condition: Any, timeout_s: float) -> bool:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self._changed.clear()
                await self._changed.wait()
        return True


class Store:
    """Records when each ask came; answers with `answer()` (None: never answers)."""

    session_timeout_ms = 60_000

    def __init__(self, answer: Any = None) -> None:
        self.answer = answer
        self.asked_at: list[float] = []

    async def create(self, path: str, data: bytes = b"", **_: Any) -> str:
        self.asked_at.append(asyncio.get_running_loop().time())
        if self.answer is None:
            await asyncio.Event().wait()
        return str(self.answer(path))


def lifecycle(store: Store, cache: Cache) -> BrokerLifecycle:
    replicas = SimpleNamespace(applied=asyncio.Event())
    replicas.applied.set()
    return BrokerLifecycle(BROKER, None, store, cache, replicas)  # type: ignore[arg-type]


def test_an_unreachable_store_is_given_up_at_the_deadline_after_every_retry() -> None:
    async def run() -> tuple[str | None, list[float], float]:
        store, cache = Store(), Cache()
        broker = lifecycle(store, cache)
        broker._on_session_state(SessionState.SUSPENDED)
        start = asyncio.get_running_loop().time()
        why = await broker.controlled_shutdown(start + 10, max_retries=3, backoff_s=2)
        await broker.close()
        return why, [t - start for t in store.asked_at], asyncio.get_running_loop().time() - start

    why, asked_at, took = virtual_time.run(run())
    assert why is not None and "unreachable" in why
    # 10 s shared by the attempts left: 0-3.33, backoff 2, 5.33-7.67, backoff 2, 9.67-10.
    assert [round(t, 2) for t in asked_at] == [0, 5.33, 9.67]
    assert took == 10


def test_a_store_that_fails_at_once_is_retried_after_the_backoff() -> None:
    def refuse(path: str) -> str:
        raise ConnectionLossError(path)

    async def run() -> tuple[str | None, list[float]]:
        store, cache = Store(refuse), Cache()
        start = asyncio.get_running_loop().time()
        why = await lifecycle(store, cache).controlled_shutdown(start + 30, 3, backoff_s=5)
        return why, [t - start for t in store.asked_at]

    why, asked_at = virtual_time.run(run())
    assert why is not None and "unreachable" in why
    assert asked_at == [0, 5, 10]


def test_leadership_moved_by_the_controller_completes_it() -> None:
    async def run() -> tuple[str | None, int]:
        cache = Cache()
        store = Store(lambda path: asyncio.get_running_loop().call_later(1, cache.move) and path)
        start = asyncio.get_running_loop().time()
        why = await lifecycle(store, cache).controlled_shutdown(start + 30, 3, backoff_s=5)
        return why, len(store.asked_at)

    assert virtual_time.run(run()) == (None, 1)
