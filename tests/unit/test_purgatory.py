"""`Purgatory`: waiters wake on a notify of a key they watch, or at their deadline; a
stopping broker's `complete_all` answers every parked request at once, and later ones
without waiting."""

from __future__ import annotations

import asyncio

from tierbroker.broker.replication.purgatory import Purgatory


async def test_a_notify_wakes_the_waiters_whose_condition_holds() -> None:
    purgatory = Purgatory()
    ready = {"a": False}
    waiter = asyncio.create_task(purgatory.wait_until(["a"], 30, lambda: ready["a"]))
    await asyncio.sleep(0)
    purgatory.notify("a")  # condition still false: back to waiting
    await asyncio.sleep(0)
    assert not waiter.done()
    ready["a"] = True
    purgatory.notify("a")
    assert await waiter is True


async def test_complete_all_answers_parked_and_later_waits_at_once() -> None:
    purgatory = Purgatory()
    parked = [asyncio.create_task(purgatory.wait_until([key], 30, lambda: False)) for key in "ab"]
    await asyncio.sleep(0)

    purgatory.complete_all()

    assert await asyncio.gather(*parked) == [False, False]
    assert await purgatory.wait_until(["c"], 30, lambda: False) is False
    assert await purgatory.wait_until(["c"], 30, lambda: True) is True
