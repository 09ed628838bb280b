"""`Purgatory`: requests parked until something happens to a partition, or a deadline.

Delayed fetches (min_bytes / max_wait_ms) and, later, delayed produces (acks=all)
and delayed remote fetches wait here. A waiter names the keys it watches and a
condition; `notify(key)` wakes the waiters of that key, which re-check their
condition. A waiter is removed from every key when it returns, however it returns,
so nothing leaks on cancellation. `complete_all()` (a stopping broker) answers every
waiter at once, as it stands, and every later wait too.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable


class Purgatory:
    def __init__(self) -> None:
        self._watchers: defaultdict[Hashable, set[asyncio.Future[None]]] = defaultdict(set)
        self._completing = False

    async def wait_until(
        self, keys: Iterable[Hashable], timeout_s: float, condition: Callable[[], bool]
    ) -> bool:
        """Wait until `condition()` holds after a notify of one of `keys`; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        keys = list(keys)
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0 or self._completing:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            for key in keys:
                self._watchers[key].add(waiter)
            try:
                async with asyncio.timeout(remaining):  # no task per wait, as wait_for makes
                    await waiter
            except TimeoutError:
                return condition()
            finally:
                for key in keys:
                    watchers = self._watchers.get(key)
                    if watchers is not None:
                        watchers.discard(waiter)
                        if not watchers:
                            del self._watchers[key]
        return True

    def notify(self, key: Hashable) -> None:
        for waiter in self._watchers.pop(key, ()):
            if not waiter.done():
                waiter.set_result(None)

    def complete_all(self) -> None:
        """Answer every waiter now (with its condition as it stands) and every later one
        without waiting: the broker is stopping, so no parked request holds it up."""
        self._completing = True
        for key in list(self._watchers):
            self.notify(key)
