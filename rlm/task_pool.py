"""`TaskPool`: runs one kind of per-partition work (copy, expiration) on a schedule.

Each partition has a next-run time: success reschedules it `task_interval_ms`
later; a retriable failure (a remote call that failed or timed out) backs off
exponentially with full jitter up to a maximum; any other failure waits the
maximum back-off: the store refusing the call (a missing bucket, denied
credentials: a configuration mistake that time does not fix) or a bug, so one bad
partition never stops the others. Every failure is one log line with its back-off;
a bug (an error that is not the store's) also gets its traceback, once, until the
task succeeds again. At most `size` tasks of the pool run at once; each pool has its
own limit, so slow copies never delay retention. Next-run times are kept in a
heap, and a task is started only when a slot is free, so a wake-up costs the
partitions it starts, not every partition led (a broker may lead many thousands).
The pool's routine task and its running tasks are owned here, cancelled and awaited
by `stop()` (none outlives it); cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
from collections.abc import Hashable
from typing import Protocol

from tierbroker.protocol.errors import KafkaError
from tierbroker.rlm.storage_health import describe
from tierbroker.storage.remote.storage_manager import RemoteStorageError

log = logging.getLogger(__name__)

STRAGGLER_GRACE_S = 5.0  # how long stop() awaits tasks cancelled twice


class PartitionTask(Protocol):
    async def run_once(self) -> None: ...


def is_retriable(error: BaseException) -> bool:
    if isinstance(error, RemoteStorageError):
        return error.retriable
    return isinstance(error, TimeoutError | OSError | KafkaError)


def is_expected(error: BaseException) -> bool:
    """A failure of the remote store, of I/O or of the metadata topic (its leader gone, too
    few brokers), not a bug: logged without a traceback."""
    return isinstance(error, RemoteStorageError | TimeoutError | OSError | KafkaError)


class TaskPool:
    def __init__(
        self, name: str, size: int, interval_ms: int, backoff_ms: int, backoff_max_ms: int
    ) -> None:
        self.name = name
        self.interval_s = interval_ms / 1000
        self.backoff_s = backoff_ms / 1000
        self.backoff_max_s = backoff_max_ms / 1000
        self.size = size
        self._tasks: dict[Hashable, PartitionTask] = {}
        self._next_run: dict[Hashable, float] = {}
        # (next run, tie-breaker, key); an entry whose time is not the key's next run is stale.
        self._due: list[tuple[float, int, Hashable]] = []
        self._pushes = itertools.count()
        self._failures: dict[Hashable, int] = {}
        self._traced: set[Hashable] = set()  # failed with a bug, traceback logged
        self._running: set[Hashable] = set()
        self._inflight: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._routine: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        """Partitions due but waiting for a free slot (the pool's queue size)."""
        now = asyncio.get_running_loop().time()
        return sum(1 for k, t in self._next_run.items() if t <= now and k not in self._running)

    def start(self) -> None:
        self._routine = asyncio.get_running_loop().create_task(self._run(), name=f"rlm-{self.name}")

    def schedule(self, key: Hashable, task: PartitionTask, delay_s: float = 0.0) -> None:
        self._tasks[key] = task
        self._set_next_run(key, asyncio.get_running_loop().time() + delay_s)

    def _set_next_run(self, key: Hashable, at: float) -> None:
        self._next_run[key] = at
        heapq.heappush(self._due, (at, next(self._pushes), key))
        self._wake.set()

    def cancel(self, key: Hashable) -> None:
        self._tasks.pop(key, None)
        self._next_run.pop(key, None)
        self._failures.pop(key, None)
        self._traced.discard(key)

    def trigger(self, key: Hashable) -> None:
        """Run the partition's task as soon as a slot is free."""
        if key in self._tasks:
            self._set_next_run(key, 0.0)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            # Invariant: at most `size` tasks run; due partitions wait in the heap, oldest first.
            while self._due and len(self._running) < self.size:
                at, _, key = self._due[0]
                if self._next_run.get(key) != at or key in self._running:
                    heapq.heappop(self._due)  # stale: rescheduled, cancelled, or running now
                    continue
                if at > now:
                    break
                heapq.heappop(self._due)
                self._running.add(key)
                task = loop.create_task(
                    self._run_one(key, self._tasks[key]), name=f"rlm-{self.name}-{key}"
                )
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            self._wake.clear()
            timeout = None
            if self._due and len(self._running) < self.size:
                timeout = max(self._due[0][0] - now, 0.0)
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _retry_delay_s(self, failures: int, error: BaseException) -> float:
        """The back-off after the `failures`-th failure in a row, which raised `error`."""
        if is_retriable(error):
            return random.uniform(0, min(self.backoff_max_s, self.backoff_s * 2 ** (failures - 1)))
        return self.backoff_max_s

    async def _run_one(self, key: Hashable, task: PartitionTask) -> None:
        delay = self.interval_s
        try:
            await task.run_once()
            self._failures.pop(key, None)
            self._traced.discard(key)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = self._retry_delay_s(failures, e)
            self._log_failure(key, failures, delay, e)
        finally:
            self._running.discard(key)
            if self._tasks.get(key) is task:
                self._set_next_run(key, asyncio.get_running_loop().time() + delay)
            elif key in self._next_run:  # scheduled anew while it ran: its entry was dropped
                self._set_next_run(key, self._next_run[key])
            self._wake.set()

    def _log_failure(self, key: Hashable, failures: int, delay: float, error: Exception) -> None:
        """One line per failure; a bug's traceback only the first time in a row."""
        trace = not is_expected(error) and key not in self._traced
        if trace:
            self._traced.add(key)
        log.log(
            logging.ERROR if trace else logging.WARNING,
            "%s task of %s failed (attempt %d), retrying in %.2fs: %s",
            self.name,
            key,
            failures,
            delay,
            describe(error) if is_expected(error) else f"{type(error).__name__}: {error}",
            exc_info=error if trace else None,
        )

    async def stop(self, timeout_s: float) -> None:
        """Cancel the routine and every running task; wait for them up to `timeout_s`.
        A task still running then (one awaiting shielded work) is cancelled again, named
        in the log, and awaited up to `STRAGGLER_GRACE_S` more: none outlives the pool."""
        tasks = [t for t in (self._routine, *self._inflight) if t is not None]
        self._routine = None
        for t in tasks:
            t.cancel()
        if not tasks:
            return
        _, stragglers = await asyncio.wait(tasks, timeout=timeout_s)
        if not stragglers:
            return
        names = sorted(t.get_name() for t in stragglers)
        log.warning("%s pool: cancelling %d tasks still running: %s", self.name, len(names), names)
        for t in stragglers:
            t.cancel()
        _, stuck = await asyncio.wait(stragglers, timeout=STRAGGLER_GRACE_S)
        if stuck:
            log.error(
                "%s pool: tasks ignore cancellation: %s", self.name, [t.get_name() for t in stuck]
            )
