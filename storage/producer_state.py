"""`ProducerStateManager`: what each idempotent producer last wrote to one partition.

Per producer id it keeps the epoch and the metadata of its last five batches
(sequence range, offsets, timestamp), so a retried batch is recognised and answered
with its original offset instead of being appended twice, and a gap in the
sequence is refused.

Snapshot file `<offset, 20 digits>.snapshot`, written at each segment roll and at
clean shutdown, holds the state as of that offset (big-endian)::

    version int16 (1) | crc32c uint32 of the rest | count int32 |
    count x (producer_id int64, epoch int16, first_seq int32, last_seq int32,
             base_offset int64, last_offset int64, timestamp int64)

Only each producer's last batch goes into a snapshot, as in Kafka. After a restart
the state is the newest valid snapshot at or below the log end offset plus the
batch headers after it; records are never decoded. Not shared between tasks.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BatchView
from tierbroker.storage.file_io import write_file

log = logging.getLogger(__name__)

MAX_CACHED_BATCHES = 5
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
SNAPSHOT_SUFFIX = ".snapshot"
_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiiqqq")
_VERSION = 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_timestamp(self) -> int:
        return self.batches[-1].timestamp if self.batches else -1

    def find_duplicate(self, batch: BatchView) -> BatchMetadata | None:
        last_seq = _last_seq(batch)
        for cached in self.batches:
            if cached.first_seq == batch.base_sequence and cached.last_seq == last_seq:
                return cached
        return None


def _last_seq(batch: BatchView) -> int:
    """Sequences wrap at INT32_MAX, as in Kafka."""
    return (batch.base_sequence + batch.last_offset_delta) % (INT32_MAX + 1)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class ProducerStateManager:
    def __init__(self, directory: Path, topic_partition: object) -> None:
        self.dir = directory
        self.topic_partition = topic_partition
        self.producers: dict[int, ProducerStateEntry] = {}

    # Validation and updates ----------------------------------------------------------

    def check(self, batch: BatchView) -> BatchMetadata | None:
        """Validate an idempotent batch; the cached metadata if it is a duplicate.

        Raises INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER as Kafka's
        ProducerAppendInfo does. A producer this partition has no state for (new, or
        its batches removed by retention) may start at any sequence (KIP-360).
        """
        entry = self.producers.get(batch.producer_id)
        pid, epoch, first_seq = batch.producer_id, batch.producer_epoch, batch.base_sequence
        if entry is None:
            return None
        if epoch < entry.epoch:
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"{self.topic_partition}: producer {pid} epoch {epoch} is older than {entry.epoch}",
            )
        if epoch > entry.epoch:
            if first_seq != 0:
                raise KafkaError(
                    ErrorCode.out_of_order_sequence_number,
                    f"{self.topic_partition}: producer {pid} new epoch {epoch} starts at "
                    f"sequence {first_seq}, not 0",
                )
            return None
        duplicate = entry.find_duplicate(batch)
        if duplicate is not None:
            return duplicate
        if not _in_sequence(entry.last_seq, first_seq):
            raise KafkaError(
                ErrorCode.out_of_order_sequence_number,
                f"{self.topic_partition}: producer {pid} sequence {first_seq} after "
                f"{entry.last_seq} (epoch {epoch})",
            )
        return None

    def check_batches(self, batches: list[BatchView]) -> BatchMetadata | None:
        """Check the idempotent batches of one produce request, in order; the cached
        metadata if the first one is a duplicate (a retry, answered as the first time)."""
        previous: dict[int, BatchView] = {}
        for i, batch in enumerate(batches):
            if not batch.has_producer_id:
                continue
            if batch.is_transactional:
                raise KafkaError(
                    ErrorCode.transactional_id_authorization_failed,
                    f"{self.topic_partition}: transactional batches are not supported",
                )
            before = previous.get(batch.producer_id)
            if before is None:
                duplicate = self.check(batch)
                if duplicate is not None and i == 0:
                    return duplicate
                if duplicate is not None:
                    raise KafkaError(
                        ErrorCode.out_of_order_sequence_number,
                        f"{self.topic_partition}: a retried batch behind new ones",
                    )
            elif batch.producer_epoch != before.producer_epoch or batch.base_sequence != (
                before.base_sequence + before.last_offset_delta + 1
            ):
                raise KafkaError(
                    ErrorCode.out_of_order_sequence_number,
                    f"{self.topic_partition}: batches of producer {batch.producer_id} in one "
                    "request are not consecutive",
                )
            previous[batch.producer_id] = batch
        return None

    def update(self, batch: BatchView) -> None:
        """Record an appended batch (its offsets already assigned)."""
        self._record(
            batch.producer_id,
            batch.producer_epoch,
            BatchMetadata(
                batch.base_sequence,
                _last_seq(batch),
                batch.base_offset,
                batch.last_offset,
                batch.max_timestamp,
            ),
        )

    def _record(self, producer_id: int, epoch: int, metadata: BatchMetadata) -> None:
        entry = self.producers.get(producer_id)
        if entry is None or epoch != entry.epoch:
            entry = self.producers[producer_id] = ProducerStateEntry(producer_id, epoch)
        entry.batches.append(metadata)

    def remove_expired(self, older_than_ms: int) -> int:
        """Forget producers whose last batch is older than `older_than_ms`."""
        expired = [pid for pid, e in self.producers.items() if e.last_timestamp < older_than_ms]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    # Snapshots -----------------------------------------------------------------------

    def snapshot_path(self, offset: int) -> Path:
        return self.dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def snapshot_offsets(self) -> list[int]:
        return sorted(
            int(p.name[:20]) for p in self.dir.glob(f"*{SNAPSHOT_SUFFIX}") if p.name[:20].isdigit()
        )

    def take_snapshot(self, offset: int, *, sync: bool = True) -> None:
        """Write the snapshot at `offset`; `sync=False` leaves its fsync to `flush_snapshot`.

        A snapshot lost or torn by a crash is skipped on load (CRC) and the state is
        rebuilt from the log, so its fsync only has to precede the recovery point.
        """
        entries = b"".join(
            _ENTRY.pack(
                e.producer_id,
                e.epoch,
                b.first_seq,
                b.last_seq,
                b.base_offset,
                b.last_offset,
                b.timestamp,
            )
            for e in self.producers.values()
            if e.batches
            for b in (e.batches[-1],)
        )
        body = struct.pack(">i", len(self.producers)) + entries
        data = struct.pack(">hI", _VERSION, crc32c(body)) + body
        self._write_snapshot(offset, data, sync)

    def install_snapshot(self, offset: int, data: bytes) -> None:
        """Write `data` (a snapshot from elsewhere, e.g. the remote tier) as the snapshot at
        `offset`, atomically; `load` checks it as any other."""
        self._write_snapshot(offset, data, sync=True)

    def _write_snapshot(self, offset: int, data: bytes, sync: bool) -> None:
        tmp = self.snapshot_path(offset).with_suffix(".tmp")
        try:
            write_file(tmp, data, sync=sync)
            os.replace(tmp, self.snapshot_path(offset))
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk keeps no half snapshot
            raise

    def flush_snapshot(self, offset: int) -> None:
        """fsync the snapshot at `offset`, if there is one."""
        try:
            fd = os.open(self.snapshot_path(offset), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(self, first_offset: int, log_end_offset: int) -> int:
        """Load the newest valid snapshot in [first_offset, log_end_offset]; its offset, or -1.

        Snapshots outside the range are deleted, as in Kafka's truncateAndReload (which
        bounds by the log start offset, not the first segment): one above describes a
        lost tail, one below misses the batches of removed segments.
        """
        self.producers.clear()
        for offset in reversed(self.snapshot_offsets()):
            path = self.snapshot_path(offset)
            if not first_offset <= offset <= log_end_offset:
                path.unlink()
                continue
            try:
                self._read_snapshot(path)
                return offset
            except ValueError as e:
                log.warning("%s: ignoring snapshot %s: %s", self.topic_partition, path, e)
                self.producers.clear()
                path.unlink()
        return -1

    def _read_snapshot(self, path: Path) -> None:
        data = path.read_bytes()
        if len(data) < _HEADER.size:
            raise ValueError(f"{len(data)} bytes is shorter than the header")
        version, crc, count = _HEADER.unpack_from(data)
        if version != _VERSION or crc32c(data[6:]) != crc:
            raise ValueError(f"version {version} or CRC mismatch")
        if len(data) != _HEADER.size + count * _ENTRY.size:
            raise ValueError(f"size {len(data)} does not match {count} entries")
        for pid, epoch, first_seq, last_seq, base, last, ts in _ENTRY.iter_unpack(
            data[_HEADER.size :]
        ):
            self._record(pid, epoch, BatchMetadata(first_seq, last_seq, base, last, ts))

    def delete_snapshots_below(self, offset: int) -> None:
        """Remove snapshots older than `offset`, the first offset left in the local log."""
        for old in self.snapshot_offsets():
            if old < offset:
                self.snapshot_path(old).unlink(missing_ok=True)

    def truncate_to(self, offset: int) -> None:
        """Drop snapshots above `offset`; the caller reloads and replays the log."""
        for snap in self.snapshot_offsets():
            if snap > offset:
                self.snapshot_path(snap).unlink(missing_ok=True)
