"""`TaskPool`: runs one kind of per-partition work (copy, expiration) on a schedule.

Each partition has a next-run time: success reschedules it `task_interval_ms`
later; a retriable failure (a remote call that failed or timed out) backs off
exponentially with full jitter up to a maximum; any other failure is logged with
its traceback and retried at the maximum back-off, so one bad partition never
stops the others. At most `size` tasks of the pool run at once; each pool has its
own limit, so slow copies never delay retention. The pool's routine task and its
running tasks are owned here and cancelled by `stop()`; cancellation is never
swallowed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Hashable
from typing import Protocol

from tierbroker.storage.remote.storage_manager import RemoteStorageError

log = logging.getLogger(__name__)


class PartitionTask(Protocol):
    async def run_once(self) -> None: ...


def is_retriable(error: BaseException) -> bool:
    if isinstance(error, RemoteStorageError):
        return error.retriable
    return isinstance(error, TimeoutError | OSError)


class TaskPool:
    def __init__(
        self, name: str, size: int, interval_ms: int, backoff_ms: int, backoff_max_ms: int
    ) -> None:
        self.name = name
        self.interval_s = interval_ms / 1000
        self.backoff_s = backoff_ms / 1000
        self.backoff_max_s = backoff_max_ms / 1000
        self._semaphore = asyncio.Semaphore(size)
        self._tasks: dict[Hashable, PartitionTask] = {}
        self._next_run: dict[Hashable, float] = {}
        self._failures: dict[Hashable, int] = {}
        self._running: set[Hashable] = set()
        self._inflight: set[asyncio.Task[None]] = set()
        self._waiting = 0
        self._wake = asyncio.Event()
        self._routine: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        """Partitions due but waiting for a free slot (the pool's queue size)."""
        return self._waiting

    def start(self) -> None:
        self._routine = asyncio.get_running_loop().create_task(self._run(), name=f"rlm-{self.name}")

    def schedule(self, key: Hashable, task: PartitionTask, delay_s: float = 0.0) -> None:
        self._tasks[key] = task
        self._next_run[key] = asyncio.get_running_loop().time() + delay_s
        self._wake.set()

    def cancel(self, key: Hashable) -> None:
        self._tasks.pop(key, None)
        self._next_run.pop(key, None)
        self._failures.pop(key, None)

    def trigger(self, key: Hashable) -> None:
        """Run the partition's task as soon as a slot is free."""
        if key in self._tasks:
            self._next_run[key] = 0.0
            self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for key in [
                k for k, t in self._next_run.items() if t <= now and k not in self._running
            ]:
                self._running.add(key)
                task = loop.create_task(
                    self._run_one(key, self._tasks[key]), name=f"rlm-{self.name}-{key}"
                )
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            waiting = [t for k, t in self._next_run.items() if k not in self._running]
            self._wake.clear()
            timeout = max(min(waiting) - now, 0.0) if waiting else None
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    async def _run_one(self, key: Hashable, task: PartitionTask) -> None:
        delay = self.interval_s
        try:
            self._waiting += 1
            try:
                await self._semaphore.acquire()
            finally:
                self._waiting -= 1
            try:
                await task.run_once()
            finally:
                self._semaphore.release()
            self._failures.pop(key, None)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            if is_retriable(e):
                delay = random.uniform(
                    0, min(self.backoff_max_s, self.backoff_s * 2 ** (failures - 1))
                )
                log.warning(
                    "%s task of %s failed (attempt %d), retrying in %.2fs: %s",
                    self.name,
                    key,
                    failures,
                    delay,
                    e,
                )
            else:
                delay = self.backoff_max_s
                log.exception("%s task of %s failed; retrying in %.0fs", self.name, key, delay)
        finally:
            self._running.discard(key)
            if self._tasks.get(key) is task:
                self._next_run[key] = asyncio.get_running_loop().time() + delay
            self._wake.set()

    async def stop(self, timeout_s: float) -> None:
        """Cancel the routine and every running task; wait for them up to `timeout_s`."""
        tasks = [t for t in (self._routine, *self._inflight) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        self._routine = None
