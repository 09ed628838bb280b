"""`ByteRateLimiter`: a token bucket for remote copy and fetch bytes per second.

`acquire(n)` waits until `n` bytes fit in the rate; a request larger than one
second's worth is let through once the bucket is full, so it cannot starve.
Shared by the tasks of one pool on the event loop.
"""

from __future__ import annotations

import asyncio
import time

from tierbroker.rlm.config import UNLIMITED


class ByteRateLimiter:
    def __init__(self, bytes_per_second: int) -> None:
        self.rate = bytes_per_second
        self._tokens = float(bytes_per_second)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self, nbytes: int) -> None:
        if self.rate >= UNLIMITED:
            return
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(float(self.rate), self._tokens + (now - self._stamp) * self.rate)
                self._stamp = now
                needed = min(nbytes, self.rate)
                if self._tokens >= needed:
                    self._tokens -= nbytes
                    return
                await asyncio.sleep((needed - self._tokens) / self.rate)
