"""`Scheduler`: the broker's periodic background work, each job one owned task.

A job that raises is logged and runs again at its next period; cancellation
stops it. `stop` cancels every job and waits for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(self, name: str, job: Callable[[], Awaitable[object]], period_ms: int) -> None:
        task = asyncio.get_running_loop().create_task(
            self._run(name, job, period_ms / 1000), name=name
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _run(name: str, job: Callable[[], Awaitable[object]], period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await job()
            except Exception:
                log.exception("background job %s failed; it runs again in %.1fs", name, period_s)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
