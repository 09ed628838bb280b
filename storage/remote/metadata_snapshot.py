"""The remote-log metadata snapshot file: written and read a piece at a time.

Binary, little-endian, so a million segments take under 100 bytes each and are
read back without holding the whole file, or a parsed copy of it, in memory::

    "RLMS" version:u16                             magic and format version (4)
    count:u32 (metadata partition:i32 next offset:i64)*count
    count:u32 partition*count
      partition: topic id:16s partition:i32 delete state:u8 (255: none)
                 name length:u16 topic name (UTF-8) segment count:u32 segment*count
      segment:   id:16s start:i64 end:i64 max timestamp ms:i64 broker:i32
                 event timestamp ms:i64 size bytes:i64 state:u8 flags:u8
                 epoch count:u16 (leader epoch:i32 start offset:i64)*epoch count
    crc32 of everything before it:u32

A segment's flags: 1 superseded, 2 no transaction index (`txn_index_empty`).

A partition's readable segments come first, by start offset, then the others in
any order, so a restore appends each readable segment at the end of its index.
The file is replaced atomically (temp file, fsync, rename, directory fsync); a
reader that finds a bad magic, version, length or checksum raises ValueError, and
the caller replays the metadata topic instead. Neither class is shared between
threads: one writer, or one reader, at a time.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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
SNAPSHOT_VERSION = 4
_SUPERSEDED = 1
_TXN_INDEX_EMPTY = 2
_HEAD = struct.Struct("<4sH")
_COUNT = struct.Struct("<I")
_OFFSET = struct.Struct("<iq")
_PARTITION = struct.Struct("<16siBH")
_SEGMENT = struct.Struct("<16sqqqiqqBBH")
_EPOCH = struct.Struct("<iq")
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


@dataclass(frozen=True, slots=True)
class SnapshotState:
    """What a snapshot holds, copied on the event loop at one instant."""

    next_offsets: dict[int, int]
    partitions: list[PartitionSnapshot]


@dataclass(frozen=True, slots=True)
class RestoredChunk:
    """Consecutive segments of one partition read from a snapshot, each with its
    superseded flag; a partition's first chunk may hold none (no segments left)."""

    tip: TopicIdPartition
    delete_state: RemotePartitionDeleteState | None
    segments: list[tuple[RemoteLogSegmentMetadata, bool]]


def write_snapshot(path: Path, state: SnapshotState) -> None:
    """Write `state` to `path` atomically; run it off the event loop."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            crc = _write_body(f, state)
            f.write(_COUNT.pack(crc))
            f.flush()
            os.fsync(f.fileno())

    replace_durably(path, write)


def _write_body(f: BinaryIO, state: SnapshotState) -> int:
    """Write everything but the checksum, a piece at a time; the checksum."""
    head = [_HEAD.pack(MAGIC, SNAPSHOT_VERSION), _COUNT.pack(len(state.next_offsets))]
    head += [_OFFSET.pack(p, o) for p, o in state.next_offsets.items()]
    head.append(_COUNT.pack(len(state.partitions)))
    piece = b"".join(head)
    crc = zlib.crc32(piece)
    f.write(piece)
    for p in state.partitions:
        seen = {m.segment_id.id for m in p.readable}
        segments = p.readable + [m for m in p.segments if m.segment_id.id not in seen]
        name = p.tip.topic_partition.topic.encode()
        delete_state = _NO_DELETE_STATE if p.delete_state is None else int(p.delete_state)
        piece = (
            _PARTITION.pack(
                p.tip.topic_id.bytes, p.tip.topic_partition.partition, delete_state, len(name)
            )
            + name
            + _COUNT.pack(len(segments))
        )
        for i in range(0, len(segments), _SEGMENTS_PER_PIECE):
            piece += b"".join(
                _encode(m, m.segment_id.id in p.superseded)
                for m in segments[i : i + _SEGMENTS_PER_PIECE]
            )
            crc = zlib.crc32(piece, crc)
            f.write(piece)
            piece = b""
            time.sleep(0)  # the loop takes the GIL now, not after the 5 ms switch interval
        if piece:
            crc = zlib.crc32(piece, crc)
            f.write(piece)
    return crc


def _encode(m: RemoteLogSegmentMetadata, superseded: bool) -> bytes:
    epochs = m.segment_leader_epochs
    return _SEGMENT.pack(
        m.segment_id.id.bytes,
        m.start_offset,
        m.end_offset,
        m.max_timestamp_ms,
        m.broker_id,
        m.event_timestamp_ms,
        m.segment_size_bytes,
        int(m.state),
        (_SUPERSEDED if superseded else 0) | (_TXN_INDEX_EMPTY if m.txn_index_empty else 0),
        len(epochs),
    ) + b"".join(_EPOCH.pack(e, o) for e, o in epochs)


class SnapshotReader:
    """Reads a snapshot file front to back: `next_offsets()` first, then `read_chunk()`
    until it returns None. Raises ValueError (or OSError) if the file is damaged."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._left = os.fstat(f.fileno()).st_size - _COUNT.size  # body bytes not read yet
        if self._left < _HEAD.size:
            raise ValueError("too short for a snapshot")
        self._buf = b""
        self._pos = 0
        self._crc = 0
        self._partitions_left = 0
        self._segments_left = 0
        self._tip: TopicIdPartition | None = None
        self._delete_state: RemotePartitionDeleteState | None = None

    @classmethod
    def open(cls, path: Path) -> SnapshotReader:
        f = open(path, "rb")  # closed by close()
        try:
            return cls(f)
        except BaseException:
            f.close()
            raise

    def close(self) -> None:
        self._f.close()

    def _take(self, n: int) -> memoryview:
        """The next `n` bytes of the body."""
        if self._pos + n > len(self._buf):
            want = min(max(n, _READ_BYTES), self._left)
            data = self._f.read(want) if want > 0 else b""
            self._left -= len(data)
            self._crc = zlib.crc32(data, self._crc)
            self._buf = self._buf[self._pos :] + data
            self._pos = 0
            if n > len(self._buf):
                raise ValueError("the snapshot ends early")
        view = memoryview(self._buf)[self._pos : self._pos + n]
        self._pos += n
        return view

    def next_offsets(self) -> dict[int, int]:
        """The header: the next offset to read in each metadata partition."""
        magic, version = _HEAD.unpack(self._take(_HEAD.size))
        if magic != MAGIC or version != SNAPSHOT_VERSION:
            raise ValueError(f"not a version {SNAPSHOT_VERSION} snapshot ({magic!r}, {version})")
        (count,) = _COUNT.unpack(self._take(_COUNT.size))
        offsets = dict(_OFFSET.iter_unpack(self._take(_OFFSET.size * count)))
        (self._partitions_left,) = _COUNT.unpack(self._take(_COUNT.size))
        return offsets

    def read_chunk(self, max_segments: int) -> RestoredChunk | None:
        """Up to `max_segments` segments of the current partition, or the next one's
        first; None at the end, once the checksum matched."""
        if not self._segments_left:
            if not self._partitions_left:
                self._check_end()
                return None
            self._read_partition()
            assert self._tip is not None
            if not self._segments_left:
                return RestoredChunk(self._tip, self._delete_state, [])
        tip = self._tip
        assert tip is not None
        count = min(max_segments, self._segments_left)
        self._segments_left -= count
        segments = [self._read_segment(tip) for _ in range(count)]
        return RestoredChunk(tip, self._delete_state, segments)

    def _read_partition(self) -> None:
        topic_id, partition, delete_state, name_length = _PARTITION.unpack(
            self._take(_PARTITION.size)
        )
        name = str(self._take(name_length), "utf-8")
        self._tip = TopicIdPartition(
            uuid.UUID(bytes=bytes(topic_id)), TopicPartition(name, partition)
        )
        self._delete_state = (
            None if delete_state == _NO_DELETE_STATE else RemotePartitionDeleteState(delete_state)
        )
        (self._segments_left,) = _COUNT.unpack(self._take(_COUNT.size))
        self._partitions_left -= 1

    def _read_segment(self, tip: TopicIdPartition) -> tuple[RemoteLogSegmentMetadata, bool]:
        (id_, start, end, max_ts, broker, event_ts, size, state, flags, epoch_count) = (
            _SEGMENT.unpack(self._take(_SEGMENT.size))
        )
        epochs = tuple(
            # The first epoch usually starts where the segment does: share that int.
            (e, start if o == start else o)
            for e, o in _EPOCH.iter_unpack(self._take(_EPOCH.size * epoch_count))
        )
        metadata = RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId(tip, uuid.UUID(bytes=bytes(id_))),
            start_offset=start,
            end_offset=end,
            max_timestamp_ms=max_ts,
            broker_id=broker,
            event_timestamp_ms=event_ts,
            segment_size_bytes=size,
            segment_leader_epochs=epochs,
            state=RemoteLogSegmentState(state),
            txn_index_empty=bool(flags & _TXN_INDEX_EMPTY),
        )
        return metadata, bool(flags & _SUPERSEDED)

    def _check_end(self) -> None:
        if self._pos != len(self._buf) or self._left:
            raise ValueError("the snapshot has bytes after its last partition")
        footer = self._f.read(_COUNT.size)
        if len(footer) != _COUNT.size:
            raise ValueError("the snapshot ends early")
        (stored,) = _COUNT.unpack(footer)
        if stored != self._crc:
            raise ValueError(f"the snapshot's checksum {stored:#x} != {self._crc:#x}")
