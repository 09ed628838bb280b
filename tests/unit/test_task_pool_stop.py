"""`TaskPool.stop`: no task of the pool outlives it, even one that does not end at once
when cancelled; those still running when the timeout ends are named in the log."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tierbroker.rlm.task_pool import TaskPool


def pool_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("rlm-test")]


class Waits:
    """Runs until cancelled; `slow_exit`: then waits for cleanup until cancelled again."""

    def __init__(self, slow_exit: bool) -> None:
        self.slow_exit = slow_exit
        self.started = asyncio.Event()

    async def run_once(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.slow_exit:
                await asyncio.Event().wait()  # cleanup that never ends on its own
            raise


@pytest.mark.parametrize("slow_exit", [False, True])
def test_stop_leaves_no_task_of_the_pool_running(
    slow_exit: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> list[asyncio.Task[object]]:
        pool = TaskPool("test", size=2, interval_ms=10, backoff_ms=10, backoff_max_ms=50)
        pool.start()
        task = Waits(slow_exit)
        pool.schedule("p0", task)
        await asyncio.wait_for(task.started.wait(), 10)

        await pool.stop(0)

        return [t for t in pool_tasks() if not t.done()]

    with caplog.at_level(logging.WARNING, logger="tierbroker.rlm.task_pool"):
        assert asyncio.run(run()) == []
    assert ("rlm-test-p0" in caplog.text) == slow_exit  # named only if it outlived the wait
