"""The remote-log metadata snapshot file: written a piece at a time, read a partition at a time.

Binary, little-endian, so a million segments take under 100 bytes each; each partition's
segments lie in one section whose length its header gives, so a reader finds every
partition without decoding a segment and decodes one partition when it is needed::

    "RLMS" version:u16                             magic and format version (5)
    count:u32 (metadata partition:i32 next offset:i64)*count
    count:u32 section*count
      section:   topic id:16s partition:i32 delete state:u8 (255: none)
                 name length:u16 topic name (UTF-8)
                 segment count:u32 segment bytes:u64 segment*count
      segment:   id:16s start:i64 end:i64 max timestamp ms:i64 broker:i32
                 event timestamp ms:i64 size bytes:i64 state:u8 flags:u8
                 epoch count:u16 (leader epoch:i32 start offset:i64)*epoch count
                 [length:u16 custom metadata]   if flag 4
    crc32 of everything before it:u32

A segment's flags: 1 superseded, 2 no transaction index (`txn_index_empty`), 4 custom
metadata follows (KIP-917, what the storage plugin's copy returned).

A partition's readable segments come first, by start offset, then the others in
any order, so a restore appends each readable segment at the end of its index.
The file is replaced atomically (temp file, fsync, rename, directory fsync).
`SnapshotFile.open` checks magic, version, every length and the checksum of the whole
file, and raises ValueError if one is wrong: the caller then replays the metadata
topic instead. A `SnapshotFile` is read with pread, so any thread may read it; a
`SectionReader` belongs to one task.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tierbroker.storage.file_io import replace_durably
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierbroker.storage.topic_partition import TopicPartition

MAGIC = b"RLMS"
SNAPSHOT_VERSION = 5
_SUPERSEDED = 1
_TXN_INDEX_EMPTY = 2
_CUSTOM_METADATA = 4
_HEAD = struct.Struct("<4sH")
_COUNT = struct.Struct("<I")
_OFFSET = struct.Struct("<iq")
_PARTITION = struct.Struct("<16siBH")
_SEGMENTS = struct.Struct("<IQ")
_SEGMENT = struct.Struct("<16sqqqiqqBBH")
_EPOCH = struct.Struct("<iq")
_CUSTOM_LENGTH = struct.Struct("<H")
_NO_DELETE_STATE = 255
_SEGMENTS_PER_PIECE = 1000  # encoded per write (a few ms); the GIL is yielded between
_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """One partition's metadata, copied on the event loop (references to immutable
    segments: cheap, and consistent with the snapshot's next offsets)."""

    tip: TopicIdPartition
    delete_state: RemotePartitionDeleteState | None
    readable: list[RemoteLogSegmentMetadata]  # by start offset
    segments: list[RemoteLogSegmentMetadata]  # every segment not deleted, unordered
    superseded: set[uuid.UUID]


@dataclass(frozen=True, slots=True, kw_only=True)
class Section:
    """Where one partition's segments lie in a snapshot file."""

    tip: TopicIdPartition
    delete_state: RemotePartitionDeleteState | None
    segment_count: int
    offset: int
    length_bytes: int


@dataclass(frozen=True, slots=True)
class SectionCopy:
    """A partition never loaded since start: its section, copied as it is from `source`."""

    section: Section
    source: SnapshotFile


@dataclass(frozen=True, slots=True)
class SnapshotState:
    """What a snapshot holds, copied on the event loop at one instant."""

    next_offsets: dict[int, int]
    partitions: list[PartitionSnapshot | SectionCopy]


def write_snapshot(path: Path, state: SnapshotState) -> None:
    """Write `state` to `path` atomically; run it off the event loop."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            crc = 0

            def out(piece: bytes) -> None:
                nonlocal crc
                crc = zlib.crc32(piece, crc)
                f.write(piece)

            _write_body(out, state)
            f.write(_COUNT.pack(crc))
            f.flush()
            os.fsync(f.fileno())

    replace_durably(path, write)


def _write_body(out: Callable[[bytes], None], state: SnapshotState) -> None:
    """Write everything but the checksum, a piece at a time."""
    head = [_HEAD.pack(MAGIC, SNAPSHOT_VERSION), _COUNT.pack(len(state.next_offsets))]
    head += [_OFFSET.pack(p, o) for p, o in state.next_offsets.items()]
    head.append(_COUNT.pack(len(state.partitions)))
    out(b"".join(head))
    for p in state.partitions:
        if isinstance(p, SectionCopy):
            s = p.section
            out(_section_head(s.tip, s.delete_state, s.segment_count, s.length_bytes))
            end = s.offset + s.length_bytes
            for at in range(s.offset, end, _READ_BYTES):
                out(p.source.read(at, min(_READ_BYTES, end - at)))
            continue
        seen = {m.segment_id.id for m in p.readable}
        segments = p.readable + [m for m in p.segments if m.segment_id.id not in seen]
        length = sum(_encoded_size(m) for m in segments)
        out(_section_head(p.tip, p.delete_state, len(segments), length))
        for i in range(0, len(segments), _SEGMENTS_PER_PIECE):
            out(
                b"".join(
                    _encode(m, m.segment_id.id in p.superseded)
                    for m in segments[i : i + _SEGMENTS_PER_PIECE]
                )
            )
            time.sleep(0)  # the loop takes the GIL now, not after the 5 ms switch interval


def _section_head(
    tip: TopicIdPartition,
    delete_state: RemotePartitionDeleteState | None,
    segment_count: int,
    length_bytes: int,
) -> bytes:
    name = tip.topic_partition.topic.encode()
    state = _NO_DELETE_STATE if delete_state is None else int(delete_state)
    return (
        _PARTITION.pack(tip.topic_id.bytes, tip.topic_partition.partition, state, len(name))
        + name
        + _SEGMENTS.pack(segment_count, length_bytes)
    )


def _encoded_size(m: RemoteLogSegmentMetadata) -> int:
    custom = m.custom_metadata
    return (
        _SEGMENT.size
        + _EPOCH.size * len(m.segment_leader_epochs)
        + (0 if custom is None else _CUSTOM_LENGTH.size + len(custom))
    )


def _encode(m: RemoteLogSegmentMetadata, superseded: bool) -> bytes:
    epochs, custom = m.segment_leader_epochs, m.custom_metadata
    flags = (
        (_SUPERSEDED if superseded else 0)
        | (_TXN_INDEX_EMPTY if m.txn_index_empty else 0)
        | (0 if custom is None else _CUSTOM_METADATA)
    )
    encoded = _SEGMENT.pack(
        m.segment_id.id.bytes,
        m.start_offset,
        m.end_offset,
        m.max_timestamp_ms,
        m.broker_id,
        m.event_timestamp_ms,
        m.segment_size_bytes,
        int(m.state),
        flags,
        len(epochs),
    ) + b"".join(_EPOCH.pack(e, o) for e, o in epochs)
    if custom is None:
        return encoded
    return encoded + _CUSTOM_LENGTH.pack(len(custom)) + custom


class SnapshotFile:
    """A snapshot opened for reading: its next offsets and its partitions' sections,
    checked whole by `open`. It holds its descriptor until `close`, so its sections stay
    readable after a newer snapshot replaces the file."""

    def __init__(self, fd: int, next_offsets: dict[int, int], sections: list[Section]) -> None:
        self.fd = fd
        self.next_offsets = next_offsets
        self.sections = sections

    @classmethod
    def open(cls, path: Path) -> SnapshotFile:
        """Open and check the snapshot at `path`: the whole file is read once for its
        checksum, then only the section headers; run it off the event loop."""
        fd = os.open(path, os.O_RDONLY)
        try:
            return cls(fd, *_read_headers(fd))
        except BaseException:
            os.close(fd)
            raise

    def read(self, offset: int, length: int) -> bytes:
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise ValueError(f"the snapshot ends early, at {offset + len(data)}")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read_headers(fd: int) -> tuple[dict[int, int], list[Section]]:
    body = os.fstat(fd).st_size - _COUNT.size
    if body < _HEAD.size:
        raise ValueError("too short for a snapshot")
    crc = 0
    for at in range(0, body, 8 * _READ_BYTES):
        crc = zlib.crc32(os.pread(fd, min(8 * _READ_BYTES, body - at), at), crc)
    (stored,) = _COUNT.unpack(os.pread(fd, _COUNT.size, body))
    if stored != crc:
        raise ValueError(f"the snapshot's checksum {stored:#x} != {crc:#x}")
    at = 0

    def take(length: int) -> bytes:
        nonlocal at
        if at + length > body:
            raise ValueError(f"the snapshot ends early, at {at}")
        at += length
        return os.pread(fd, length, at - length)

    magic, version = _HEAD.unpack(take(_HEAD.size))
    if magic != MAGIC or version != SNAPSHOT_VERSION:
        raise ValueError(f"not a version {SNAPSHOT_VERSION} snapshot ({magic!r}, {version})")
    (count,) = _COUNT.unpack(take(_COUNT.size))
    next_offsets = dict(_OFFSET.iter_unpack(take(_OFFSET.size * count)))
    (count,) = _COUNT.unpack(take(_COUNT.size))
    sections = []
    for _ in range(count):
        topic_id, partition, delete_state, name_length = _PARTITION.unpack(take(_PARTITION.size))
        name = take(name_length).decode()
        segment_count, length = _SEGMENTS.unpack(take(_SEGMENTS.size))
        sections.append(
            Section(
                tip=TopicIdPartition(uuid.UUID(bytes=topic_id), TopicPartition(name, partition)),
                delete_state=None
                if delete_state == _NO_DELETE_STATE
                else RemotePartitionDeleteState(delete_state),
                segment_count=segment_count,
                offset=at,
                length_bytes=length,
            )
        )
        at += length
        if at > body:
            raise ValueError(f"a section runs past the snapshot's end, at {at}")
    if at != body:
        raise ValueError("the snapshot has bytes after its last partition")
    return next_offsets, sections


class SectionReader:
    """Decodes one section's segments in order, a chunk at a time (`read`), reading the
    file a piece at a time; each segment refers to the section's one `TopicIdPartition`."""

    def __init__(self, file: SnapshotFile, section: Section) -> None:
        self._file = file
        self._tip = section.tip
        self._at = section.offset  # the next byte of the file to read
        self._end = section.offset + section.length_bytes
        self._left = section.segment_count  # segments not decoded yet
        self._buf = b""
        self._pos = 0

    @property
    def left(self) -> int:
        """Segments not decoded yet."""
        return self._left

    @property
    def done(self) -> bool:
        return not self._left

    def read(self, max_segments: int | None = None) -> list[tuple[RemoteLogSegmentMetadata, bool]]:
        """The next `max_segments` (all, if None) segments, each with its superseded flag."""
        count = self._left if max_segments is None else min(max_segments, self._left)
        segments = [self._read_segment() for _ in range(count)]
        self._left -= count
        if not self._left and (self._pos != len(self._buf) or self._at != self._end):
            raise ValueError(f"{self._tip}: its snapshot section has bytes after its segments")
        return segments

    def _take(self, n: int) -> int:
        """Buffer the next `n` bytes of the section; where they start in `_buf`."""
        at = self._pos
        if at + n > len(self._buf):
            want = min(max(n, _READ_BYTES), self._end - self._at)
            data = self._file.read(self._at, want)
            self._at += len(data)
            self._buf = self._buf[at:] + data
            at = 0
            if n > len(self._buf):
                raise ValueError(f"{self._tip}: its snapshot section ends early")
        self._pos = at + n
        return at

    def _read_segment(self) -> tuple[RemoteLogSegmentMetadata, bool]:
        at = self._take(_SEGMENT.size)
        (id_, start, end, max_ts, broker, event_ts, size, state, flags, epoch_count) = (
            _SEGMENT.unpack_from(self._buf, at)
        )
        at = self._take(_EPOCH.size * epoch_count)
        # The first epoch usually starts where the segment does: share that int.
        if epoch_count == 1:  # the common case, without a generator
            epoch, offset = _EPOCH.unpack_from(self._buf, at)
            epochs: tuple[tuple[int, int], ...] = ((epoch, start if offset == start else offset),)
        else:
            view = memoryview(self._buf)[at : at + _EPOCH.size * epoch_count]
            epochs = tuple((e, start if o == start else o) for e, o in _EPOCH.iter_unpack(view))
        custom = None
        if flags & _CUSTOM_METADATA:
            (length,) = _CUSTOM_LENGTH.unpack_from(self._buf, self._take(_CUSTOM_LENGTH.size))
            at = self._take(length)
            custom = bytes(self._buf[at : at + length])
        metadata = RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId(self._tip, uuid.UUID(bytes=id_)),
            start_offset=start,
            end_offset=end,
            max_timestamp_ms=max_ts,
            broker_id=broker,
            event_timestamp_ms=event_ts,
            segment_size_bytes=size,
            segment_leader_epochs=epochs,
            state=RemoteLogSegmentState(state),
            txn_index_empty=bool(flags & _TXN_INDEX_EMPTY),
            custom_metadata=custom,
        )
        return metadata, bool(flags & _SUPERSEDED)
