"""Size-prefixed frames: a big-endian int32 length, then that many bytes.

`FrameReader` is fed by a buffered protocol: it hands out the buffer the socket
reads into and returns the frames completed by each read. Small frames are cut
from a shared scratch buffer; a frame larger than what is left there gets a buffer
of its own, received into directly, so large produce requests are not copied
twice. It does no I/O.
"""

from __future__ import annotations

import struct

from protocol.errors import ErrorCode, KafkaError

SIZE_PREFIX_BYTES = 4
_SIZE = struct.Struct(">i")
_SCRATCH_BYTES = 64 * 1024


class FrameError(KafkaError):
    """A frame that cannot be read: the connection must be closed."""


class FrameReader:
    """Splits a byte stream into frames of at most `max_frame_bytes`. Not shared between tasks."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._start = 0  # first unconsumed byte in scratch
        self._end = 0  # end of received bytes in scratch
        self._large: bytearray | None = None  # the frame being received outside scratch
        self._large_filled = 0

    def get_buffer(self) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if self._start == self._end:
            self._start = self._end = 0
        elif _SCRATCH_BYTES - self._end < SIZE_PREFIX_BYTES:
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
            if size < 0 or size > self.max_frame_bytes:
                raise FrameError(
                    ErrorCode.invalid_request,
                    f"frame size {size} outside 0..{self.max_frame_bytes} "
                    "(socket.request.max.bytes)",
                )
            body_start = self._start + SIZE_PREFIX_BYTES
            if self._end - body_start >= size:
                frames.append(bytes(self._scratch[body_start : body_start + size]))
                self._start = body_start + size
            elif body_start + size <= _SCRATCH_BYTES:
                break  # the rest of this frame fits in scratch
            else:
                self._start_large(body_start, size)
                break
        return frames

    def _start_large(self, body_start: int, size: int) -> None:
        received = self._end - body_start
        self._large = bytearray(size)
        self._large[:received] = self._scratch[body_start : self._end]
        self._large_filled = received
        self._start = self._end = 0

    def _compact(self) -> None:
        pending = self._end - self._start
        self._scratch[:pending] = self._scratch[self._start : self._end]
        self._start, self._end = 0, pending

    @property
    def has_partial_frame(self) -> bool:
        return self._large is not None or self._end > self._start
