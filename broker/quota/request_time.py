"""`LoopTime`: how long a request's handler holds the event loop, for `request_percentage`.

Kafka's request quota counts the time a request thread spends on a client's requests,
as a percentage of one thread (100 = one thread busy all the time). tierbroker handles
every request on one event loop: the time that counts is the time the loop spends
running the request's own steps, from decoding to its response, not the time it waits
(for a purgatory, the disk, a worker thread, another broker). `LoopTime` drives the
handler's coroutine step by step, as the task would, and adds up each step's time.
Work done in worker threads (encoding a large response) is not counted.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
NANOS_TO_PERCENT = 100 / 1_000_000_000  # a second of loop time is 100% of one thread


class LoopTime(Generic[T]):
    """Awaits `coroutine`, adding the time each of its steps runs to `busy_ns`."""

    __slots__ = ("_coroutine", "busy_ns")

    def __init__(self, coroutine: Coroutine[Any, Any, T]) -> None:
        self._coroutine = coroutine
        self.busy_ns = 0

    @property
    def percent_seconds(self) -> float:
        """The time as Kafka records it in the request quota's rate."""
        return self.busy_ns * NANOS_TO_PERCENT

    def __await__(self) -> Generator[Any, Any, T]:
        coroutine = self._coroutine
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started_ns = time.perf_counter_ns()
            try:
                if thrown is None:
                    yielded = coroutine.send(sent)
                else:
                    yielded = coroutine.throw(thrown)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            finally:
                self.busy_ns += time.perf_counter_ns() - started_ns
            try:
                sent, thrown = (yield yielded), None
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as e:  # a cancellation thrown into the task: passed on
                sent, thrown = None, e
