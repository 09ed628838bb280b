"""State kept out of the cyclic garbage collector's full collections.

CPython's full collection walks every object it tracks, and a broker's long-lived state
grows with what it hosts: a partition's (its log, segment, indexes, producer state,
tiering tasks) is about 30 objects, a remote segment's metadata about 10. At 10,000
partitions one walk held the event loop for over 100 ms, at a million remote segments
for 2.8 s. That state lives until its topic or segment is deleted and is then freed by
reference counting alone (it holds no cycles; tests keep it so), so once a batch of it
has been made, everything alive is moved to the permanent generation, which
collections never walk.

The price: an object alive at a freeze that later dies inside a reference cycle is
never freed. A young collection just before each freeze frees the cycles already dead;
what remains is a handful of objects per batch.

Freezing is the process's business, not a library's: only `tierbroker serve`, which owns
its process, turns it on (`freeze_heap_in_this_process`); brokers embedded in a user's
process (the pytest plugin, `EmbeddedCluster`) leave that process's collector alone.
"""

from __future__ import annotations

import gc

_freezing = False  # whether this process's heap may be frozen; only `serve` says yes


def freeze_heap_in_this_process(enabled: bool = True) -> None:
    """Let (or stop) `LongLivedObjects` freeze the heap: for a process the broker owns."""
    global _freezing
    _freezing = enabled


class LongLivedObjects:
    """Counts long-lived things made and freezes the heap after every `freeze_every`."""

    def __init__(self, freeze_every: int) -> None:
        self.freeze_every = freeze_every
        self._unfrozen = 0

    def added(self) -> None:
        self._unfrozen += 1
        if self._unfrozen >= self.freeze_every:
            self.freeze()

    def freeze(self) -> None:
        self._unfrozen = 0
        freeze_long_lived()


def freeze_long_lived() -> None:
    """Move every object alive now out of the collector's walks, if this process allows
    it: for after a batch of long-lived state has been made."""
    if _freezing:
        gc.collect(1)
        gc.freeze()
