"""Run a coroutine on an event loop whose clock is virtual: when nothing is ready, time jumps
to the next timer at once. Sleeps, timeouts and scheduled callbacks then happen at exactly
the loop times they were scheduled for, however loaded the machine, so a test can assert
scheduling decisions (when a task runs again) rather than wall-clock windows.

Only for code that waits on the loop's own timers and events: a thread or a socket that
takes real time to answer would see the virtual clock run ahead of it.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that, instead of waiting `timeout` seconds for nothing, moves the clock."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0:
            return ready if ready or timeout is not None else super().select(None)
        self.clock.now += timeout
        return []


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._clock = _Clock()
        super().__init__(_JumpingSelector(self._clock))

    def time(self) -> float:
        return self._clock.now


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion in virtual time, starting at 0."""
    with asyncio.Runner(loop_factory=_VirtualTimeLoop) as runner:
        return runner.run(main)
