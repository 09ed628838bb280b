"""Size-prefixed frames: a big-endian int32 length, then that many bytes.

`FrameReader` is fed by a buffered protocol: it hands out the buffer the socket
reads into and returns the frames completed by each read. A frame that fits in the
connection's scratch buffer (64 KiB) is cut from it; a larger frame gets a buffer
of its own, received into directly, so large produce requests are not copied
twice. That buffer is allocated only once the broker-wide `MemoryPool` has
reserved the frame's size: a size prefix alone commits no memory. It does no I/O.
"""

from __future__ import annotations

import struct

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.memory_pool import MemoryPool

SIZE_PREFIX_BYTES = 4
SCRATCH_BYTES = 64 * 1024
_SIZE = struct.Struct(">i")


def pooled_bytes(frame_bytes: int) -> int:
    """What a frame of `frame_bytes` holds of the pool: 0 if it is cut from scratch."""
    return frame_bytes if frame_bytes + SIZE_PREFIX_BYTES > SCRATCH_BYTES else 0


class FrameError(KafkaError):
    """A frame that cannot be read: the connection must be closed."""


class FrameReader:
    """Splits a byte stream into frames of at most `max_frame_bytes`. Not shared between tasks.

    When the pool cannot grant a large frame's buffer, `awaiting_memory_bytes` says how
    much it waits for; the caller stops reading, waits on the pool, and calls
    `memory_granted` once the pool has reserved that much.
    """

    def __init__(self, max_frame_bytes: int, pool: MemoryPool) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.pool = pool
        self.awaiting_memory_bytes = 0
        self._scratch = bytearray(SCRATCH_BYTES)
        self._start = 0  # first unconsumed byte in scratch
        self._end = 0  # end of received bytes in scratch
        self._compact_next = False  # the pending frame fits in scratch, but not from _start
        self._large: bytearray | None = None  # the frame being received outside scratch
        self._large_filled = 0

    def get_buffer(self) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if self._start == self._end:
            self._start = self._end = 0
        elif self._compact_next or SCRATCH_BYTES - self._end < SIZE_PREFIX_BYTES:
            self._compact()
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> list[bytes | memoryview]:
        """Account for `nbytes` received into the last buffer; return completed frames."""
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled < len(self._large):
                return []
            frame, self._large = memoryview(self._large).toreadonly(), None
            return [frame]
        self._end += nbytes
        frames: list[bytes | memoryview] = []
        while self._end - self._start >= SIZE_PREFIX_BYTES:
            (size,) = _SIZE.unpack_from(self._scratch, self._start)
            limit = min(self.max_frame_bytes, self.pool.capacity_bytes)
            if size < 0 or size > limit:
                raise FrameError(
                    ErrorCode.invalid_request,
                    f"frame size {size} outside 0..{limit} "
                    "(socket.request.max.bytes, queued.max.request.bytes)",
                )
            body_start = self._start + SIZE_PREFIX_BYTES
            if self._end - body_start >= size:
                frames.append(bytes(self._scratch[body_start : body_start + size]))
                self._start = body_start + size
            elif not pooled_bytes(size):
                self._compact_next = body_start + size > SCRATCH_BYTES
                break
            elif self.pool.try_reserve(size):
                self._start_large(size)
                break
            else:
                self.awaiting_memory_bytes = size
                break
        return frames

    def memory_granted(self) -> None:
        """The pool reserved `awaiting_memory_bytes` for the pending frame: allocate it."""
        size, self.awaiting_memory_bytes = self.awaiting_memory_bytes, 0
        self._start_large(size)

    def _start_large(self, size: int) -> None:
        body_start = self._start + SIZE_PREFIX_BYTES
        received = self._end - body_start
        self._large = bytearray(size)
        self._large[:received] = self._scratch[body_start : self._end]
        self._large_filled = received
        self._start = self._end = 0

    def _compact(self) -> None:
        pending = self._end - self._start
        self._scratch[:pending] = self._scratch[self._start : self._end]
        self._start, self._end = 0, pending
        self._compact_next = False

    def close(self) -> None:
        """Return the partial frame's memory to the pool; the stream ends here."""
        if self._large is not None:
            self.pool.release(len(self._large))
            self._large = None

    @property
    def has_partial_frame(self) -> bool:
        return self._large is not None or self._end > self._start
