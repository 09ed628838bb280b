"""`UnloadedPartitions`: the partitions of the snapshot read at start whose segments are
not in memory yet, each loaded when it is first needed.

A restart reads only the snapshot's header and its partitions' section headers (and the
whole file once, for its checksum), so how soon the broker serves does not depend on the
remote history: a million segments take no time until asked for. A partition is loaded into the
`RemoteLogMetadataCache` when a question about it comes (all at once, `load`), or a chunk
per call (`load`, `max_segments`) by the RLMM's loader for the partitions this broker
leads or follows; both continue one `SectionReader`, so a question during a chunked load
finishes it, and no segment is restored twice. Events of an unloaded partition, read
from the metadata topic after the snapshot, wait in order and are handed back when its
last segment is restored, to be applied then: the state an eager restore would reach.

The snapshot file stays open while a partition is unloaded: its sections are read from
it and copied from it, as they are, into later snapshots (`copies`). Nothing here is
written: after a crash the next start reads the newest snapshot again. Not shared
between tasks: callers are on the event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from tierbroker.storage.remote.metadata_cache import RemoteLogMetadataCache
from tierbroker.storage.remote.metadata_snapshot import (
    Section,
    SectionCopy,
    SectionReader,
    SnapshotFile,
)
from tierbroker.storage.remote.segment_metadata import TopicIdPartition

# An event waiting for its partition: (metadata partition, offset, the record's value).
PendingEvent = tuple[int, int, bytes]


@dataclass(slots=True)
class _Unloaded:
    section: Section
    reader: SectionReader | None = None  # made by the first load; restored up to it
    pending: list[PendingEvent] = field(default_factory=list)


class UnloadedPartitions:
    def __init__(self, file: SnapshotFile | None = None) -> None:
        self._file = file
        self._partitions = {s.tip: _Unloaded(s) for s in file.sections} if file else {}

    def __contains__(self, tip: TopicIdPartition) -> bool:
        return tip in self._partitions

    def __bool__(self) -> bool:
        return bool(self._partitions)

    def __iter__(self) -> Iterator[TopicIdPartition]:
        return iter(list(self._partitions))

    def segment_count(self) -> int:
        return sum(p.section.segment_count for p in self._partitions.values())

    def left(self, tip: TopicIdPartition) -> int:
        """The partition's segments not restored yet."""
        p = self._partitions[tip]
        return p.section.segment_count if p.reader is None else p.reader.left

    def wait(self, tip: TopicIdPartition, event: PendingEvent) -> None:
        """Keep an event of an unloaded partition until it is loaded."""
        self._partitions[tip].pending.append(event)

    def with_pending(self) -> list[TopicIdPartition]:
        return [tip for tip, p in self._partitions.items() if p.pending]

    def copies(self) -> list[SectionCopy]:
        """The partitions that are not loaded, for a snapshot: each its section as read at
        start (none with pending events: those are loaded first)."""
        assert not self.with_pending(), "load the partitions with events first"
        file = self._file
        return [SectionCopy(p.section, file) for p in self._partitions.values()] if file else []

    def load(
        self, tip: TopicIdPartition, cache: RemoteLogMetadataCache, max_segments: int | None = None
    ) -> list[PendingEvent] | None:
        """Restore up to `max_segments` more of the partition's segments (all, if None);
        once the last is, forget it and return its waiting events, else None."""
        p = self._partitions[tip]
        if p.reader is None:
            assert self._file is not None
            p.reader = SectionReader(self._file, p.section)
            cache.restore_partition(tip, p.section.delete_state)
        for metadata, superseded in p.reader.read(max_segments):
            cache.restore(metadata, superseded)
        # Listed here until its last segment is restored: no question sees part of it.
        if not p.reader.done:
            return None
        del self._partitions[tip]
        return p.pending

    def close_if_done(self) -> None:
        """Close the file once nothing is left to load (and no snapshot copies from it)."""
        if not self._partitions:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
