"""`OffsetMap`: the cleaner's map from a key to the offset of its last record.

Keys are held as their MD5 digest, as Kafka's `SkimpyOffsetMap` holds them: a fixed
16 bytes whatever the key's size, and a collision among a pass's keys is as unlikely
as in Kafka. The map is bounded by memory (`log.cleaner.dedupe.buffer.size` shared
by the cleaner threads, times `log.cleaner.io.buffer.load.factor`): a Python dict
costs about `ENTRY_BYTES` an entry where Kafka's array costs 24, so a pass holds
fewer keys than Kafka's would with the same buffer, and the cleaner makes more
passes over a log with more keys than that.
"""

from __future__ import annotations

import hashlib

# Measured with tracemalloc: a 16-byte digest, an offset past 2**30, the dict's slot
# and index, with the dict at its sparsest just after it grew.
ENTRY_BYTES = 160


class OffsetMap:
    def __init__(self, memory_bytes: int, load_factor: float = 0.9) -> None:
        self.slots = max(1, int(memory_bytes * load_factor) // ENTRY_BYTES)
        self._offsets: dict[bytes, int] = {}
        self.latest_offset = -1  # the largest offset put since the last clear

    @staticmethod
    def digest(key: bytes) -> bytes:
        return hashlib.md5(key, usedforsecurity=False).digest()

    def put(self, key: bytes, offset: int) -> None:
        self._offsets[self.digest(key)] = offset
        self.latest_offset = offset

    def get(self, key: bytes) -> int:
        """The offset of the key's last record, or -1 if the map has not seen it."""
        return self._offsets.get(self.digest(key), -1)

    def free_slots(self) -> int:
        return self.slots - len(self._offsets)

    @property
    def size(self) -> int:
        return len(self._offsets)

    @property
    def utilization(self) -> float:
        return len(self._offsets) / self.slots

    def clear(self) -> None:
        self._offsets.clear()
        self.latest_offset = -1
