"""Partition state kept out of the cyclic garbage collector's full collections.

CPython's full collection walks every object it tracks, and a partition's state (its
log, segment, indexes, producer state, tiering tasks) is about 30 of them: at 10,000
partitions one walk holds the event loop for over 100 ms. That state lives until its
topic is deleted and is then freed by reference counting alone (it holds no cycles;
tests keep it so), so once a batch of partitions is led everything alive is moved to
the permanent generation, which collections never walk.

The price: an object alive at a freeze that later dies inside a reference cycle is
never freed. A young collection just before each freeze frees the cycles already dead;
what remains is a handful of objects per batch of partitions.
"""

from __future__ import annotations

import gc

FREEZE_EVERY_PARTITIONS = 256  # partitions led between two freezes


class LongLivedObjects:
    """Counts partitions led and freezes the heap after every `FREEZE_EVERY_PARTITIONS`."""

    def __init__(self) -> None:
        self._unfrozen = 0

    def partition_led(self) -> None:
        self._unfrozen += 1
        if self._unfrozen >= FREEZE_EVERY_PARTITIONS:
            self.freeze()

    def freeze(self) -> None:
        """Move every object alive now out of the collector's walks."""
        gc.collect(1)
        gc.freeze()
        self._unfrozen = 0
