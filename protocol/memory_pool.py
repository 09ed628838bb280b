"""`MemoryPool`: the broker-wide budget for request buffers (`queued.max.request.bytes`).

A large frame's buffer is allocated only once the pool grants its size, as Kafka's
request memory pool does; a connection the pool cannot serve stops reading until
memory is released, and waiters are granted in arrival order, so a big frame is not
starved by smaller ones. The pool does no I/O and is used from the event loop only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class MemoryPool:
    """Counts reserved bytes against `capacity_bytes`; `used_bytes` never exceeds it."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._waiters: deque[tuple[int, Callable[[], None]]] = deque()

    def try_reserve(self, nbytes: int) -> bool:
        """Reserve `nbytes` if they are free now and nobody waits before us."""
        if self._waiters or self.used_bytes + nbytes > self.capacity_bytes:
            return False
        self.used_bytes += nbytes
        return True

    def wait(self, nbytes: int, granted: Callable[[], None]) -> None:
        """Call `granted` once `nbytes` are reserved for the caller (at most `capacity_bytes`)."""
        assert nbytes <= self.capacity_bytes, "a frame larger than the pool is refused earlier"
        self._waiters.append((nbytes, granted))
        self._grant()

    def cancel(self, granted: Callable[[], None]) -> None:
        """Forget a waiter that went away before its memory was granted."""
        self._waiters = deque(w for w in self._waiters if w[1] != granted)
        self._grant()

    def release(self, nbytes: int) -> None:
        self.used_bytes -= nbytes
        assert self.used_bytes >= 0, "released more than was reserved"
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used_bytes + self._waiters[0][0] <= self.capacity_bytes:
            nbytes, granted = self._waiters.popleft()
            self.used_bytes += nbytes
            granted()
