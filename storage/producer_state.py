"""`ProducerStateManager`: what each idempotent or transactional producer last wrote to
one partition, and the transactions still open on it (Kafka's `ProducerStateManager`).

Per producer id it keeps the epoch and the metadata of its last five batches
(sequence range, offsets, timestamp), so a retried batch is recognised and answered
with its original offset instead of being appended twice, and a gap in the
sequence is refused. A transactional batch opens its producer's transaction; the
end-transaction marker closes it (`CompletedTxn`). The first offset of the oldest
transaction not yet decided, or decided by a marker above the high watermark, is
the first unstable offset: the last stable offset (LSO) never passes it.

Snapshot file `<offset, 20 digits>.snapshot`, written at each segment roll and at
clean shutdown, holds the state as of that offset in Kafka's layout (big-endian)::

    version int16 (1) | crc32c uint32 of the rest | count int32 |
    count x (producer_id int64, epoch int16, last_seq int32, last_offset int64,
             offset_delta int32, timestamp int64, coordinator_epoch int32,
             current_txn_first_offset int64 (-1: none))

An older layout of this broker's, with 42-byte entries and no transactions
(`first_seq`, `last_seq`, `base_offset`, `last_offset`, `timestamp` after the epoch), is
still read. Only each producer's last batch goes into a snapshot, as in Kafka. After
a restart the state is the newest valid snapshot at or below the log end offset plus
the batches after it; only end-transaction markers are decoded. Not shared between
tasks.
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
from tierbroker.protocol.records.control import EndTxnMarker
from tierbroker.storage.file_io import fsync_if_exists, write_file

log = logging.getLogger(__name__)

MAX_CACHED_BATCHES = 5
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
SNAPSHOT_SUFFIX = ".snapshot"
NO_TXN = -1
_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
_OLD_ENTRY = struct.Struct(">qhiiqqq")  # this broker's layout before transactions
_VERSION = 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction its marker closed: data from `first_offset`, the marker at `last_offset`."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = NO_TXN

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

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


@dataclass(eq=False, slots=True)
class VerificationGuard:
    """A transaction's check with its coordinator before its first batch here (KIP-890),
    valid until a marker ends the transaction; known by identity."""

    epoch: int  # of the batch checked
    # Transactions v2: the marker ending the previous transaction, at this same (bumped)
    # epoch, comes before the next transaction's first batch and leaves the check standing.
    supports_epoch_bump: bool


class ProducerStateManager:
    def __init__(self, directory: Path, topic_partition: object) -> None:
        self.dir = directory
        self.topic_partition = topic_partition
        self.producers: dict[int, ProducerStateEntry] = {}
        # first offset -> producer id of each open transaction; offsets only grow, so the
        # dict's order is theirs and its first key the oldest.
        self.ongoing_txns: dict[int, int] = {}
        # first offset -> marker offset of each transaction decided above the high watermark.
        self.unreplicated_txns: dict[int, int] = {}
        # producer id -> the guard of its transaction's check with the coordinator (KIP-890)
        self._verifications: dict[int, VerificationGuard] = {}

    # Validation and updates ----------------------------------------------------------

    def check(self, batch: BatchView) -> BatchMetadata | None:
        """Validate an idempotent batch; the cached metadata if it is a duplicate.

        Raises INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER as Kafka's
        ProducerAppendInfo does, and INVALID_TXN_STATE for a batch outside the
        transaction its producer has open. A producer this partition has no state for
        (new, or its batches removed by retention) may start at any sequence (KIP-360).
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
        if entry.current_txn_first_offset != NO_TXN and not batch.is_transactional:
            raise KafkaError(
                ErrorCode.invalid_txn_state,
                f"{self.topic_partition}: producer {pid} wrote a non-transactional batch "
                f"while its transaction from offset {entry.current_txn_first_offset} is open",
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

    def check_batches(
        self, batches: list[BatchView], transactional: bool = False, sequenced: bool = True
    ) -> BatchMetadata | None:
        """Check the idempotent batches of one produce request, in order; the cached
        metadata if the first one is a duplicate (a retry, answered as the first time).

        Transactional batches need a request with a transactional id (`transactional`),
        as Kafka's ProduceRequest.validateRecords: TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
        Batches a coordinator writes (not `sequenced`) are checked for their epoch only.
        """
        previous: dict[int, BatchView] = {}
        for i, batch in enumerate(batches):
            if not batch.has_producer_id:
                continue
            if batch.is_transactional and not transactional:
                raise KafkaError(
                    ErrorCode.transactional_id_authorization_failed,
                    f"{self.topic_partition}: a transactional batch in a produce request "
                    "without a transactional id",
                )
            if not sequenced:
                self._check_epoch(batch)
                continue
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

    def _check_epoch(self, batch: BatchView) -> None:
        entry = self.producers.get(batch.producer_id)
        if entry is not None and batch.producer_epoch < entry.epoch:
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"{self.topic_partition}: producer {batch.producer_id} epoch "
                f"{batch.producer_epoch} is older than {entry.epoch}",
            )

    def check_marker(
        self, producer_id: int, epoch: int, marker: EndTxnMarker, transaction_version: int = 0
    ) -> None:
        """Validate an end-transaction marker from a transaction coordinator, as Kafka's
        ProducerAppendInfo.appendEndTxnMarker: an older producer epoch is
        INVALID_PRODUCER_EPOCH, an older coordinator epoch TRANSACTION_COORDINATOR_FENCED.
        Transactions v2 end at a bumped epoch: their marker must come with a newer epoch
        than the producer's, unless it repeats one already written (no transaction open)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        v2 = transaction_version >= 2
        stale = epoch <= entry.epoch if v2 else epoch < entry.epoch
        repeated = v2 and epoch == entry.epoch and entry.current_txn_first_offset == NO_TXN
        if stale and not repeated:
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"{self.topic_partition}: marker of producer {producer_id} at epoch {epoch}, "
                f"{'not newer' if v2 else 'older'} than {entry.epoch}",
            )
        if marker.coordinator_epoch < entry.coordinator_epoch:
            raise KafkaError(
                ErrorCode.transaction_coordinator_fenced,
                f"{self.topic_partition}: marker of producer {producer_id} from coordinator "
                f"epoch {marker.coordinator_epoch}, older than {entry.coordinator_epoch}",
            )

    def update(self, batch: BatchView) -> None:
        """Record an appended data batch (its offsets already assigned); a transactional
        one opens its producer's transaction if none is open."""
        entry = self._entry(batch.producer_id, batch.producer_epoch)
        entry.batches.append(
            BatchMetadata(
                batch.base_sequence,
                _last_seq(batch),
                batch.base_offset,
                batch.last_offset,
                batch.max_timestamp,
            )
        )
        entry.last_timestamp = batch.max_timestamp
        if batch.is_transactional and entry.current_txn_first_offset == NO_TXN:
            entry.current_txn_first_offset = batch.base_offset
            self.ongoing_txns[batch.base_offset] = batch.producer_id
            self._verifications.pop(batch.producer_id, None)

    # KIP-890 part 1: a transaction's first batch here is checked with the coordinator.

    def start_verification(
        self, producer_id: int, epoch: int, supports_epoch_bump: bool
    ) -> VerificationGuard | None:
        """A guard for checking with the coordinator that the producer's transaction has
        this partition; None if it has one open here at `epoch` already. One open at an
        older epoch may be a transactions v2 producer's previous one, its marker not yet
        written: the next must wait for it, so it is checked."""
        entry = self.producers.get(producer_id)
        if entry is not None and entry.current_txn_first_offset != NO_TXN and entry.epoch == epoch:
            return None
        guard = self._verifications.get(producer_id)
        if guard is None or guard.epoch != epoch:  # a check of an older epoch is not this one
            guard = self._verifications[producer_id] = VerificationGuard(epoch, supports_epoch_bump)
        return guard

    def is_verified(self, producer_id: int, guard: object) -> bool:
        """No marker came between the check that made `guard` and now."""
        return self._verifications.get(producer_id) is guard

    def end_verification(self, producer_id: int, guard: object) -> None:
        """The check failed: forget its guard."""
        if self._verifications.get(producer_id) is guard:
            del self._verifications[producer_id]

    def update_marker(self, batch: BatchView, marker: EndTxnMarker | None) -> CompletedTxn | None:
        """Record an appended end-transaction marker (None: a control batch the cleaner
        emptied); the transaction it closed, if one was open. The closed transaction stays
        unstable until `on_high_watermark_updated` passes its marker."""
        entry = self._entry(batch.producer_id, batch.producer_epoch)
        entry.last_timestamp = batch.max_timestamp
        guard = self._verifications.get(batch.producer_id)
        # A check before the marker is stale, unless it is the next v2 transaction's.
        if guard is None or not (guard.supports_epoch_bump and guard.epoch == batch.producer_epoch):
            self._verifications.pop(batch.producer_id, None)
        first = entry.current_txn_first_offset
        if marker is None or first == NO_TXN:
            return None
        entry.coordinator_epoch = marker.coordinator_epoch
        entry.current_txn_first_offset = NO_TXN
        del self.ongoing_txns[first]
        self.unreplicated_txns[first] = batch.base_offset
        return CompletedTxn(batch.producer_id, first, batch.base_offset, marker.is_abort)

    def _entry(self, producer_id: int, epoch: int) -> ProducerStateEntry:
        """The producer's entry at `epoch`: a new epoch forgets the old epoch's batches."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerStateEntry(producer_id, epoch)
        elif epoch != entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
        return entry

    # Transactions --------------------------------------------------------------------

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest transaction not decided or not yet replicated."""
        first_ongoing = next(iter(self.ongoing_txns), None)
        first_unreplicated = min(self.unreplicated_txns, default=None)
        if first_ongoing is None or first_unreplicated is None:
            return first_unreplicated if first_ongoing is None else first_ongoing
        return min(first_ongoing, first_unreplicated)

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO once `completed` is decided: the oldest other open transaction's first
        offset, else just past its marker (the `lastStableOffset` of its index entry)."""
        return next(iter(self.ongoing_txns), completed.last_offset + 1)

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Forget decided transactions whose marker the high watermark has passed."""
        if self.unreplicated_txns:
            self.unreplicated_txns = {
                first: marker
                for first, marker in self.unreplicated_txns.items()
                if marker >= high_watermark
            }

    def remove_expired(self, older_than_ms: int) -> int:
        """Forget producers whose last write is older than `older_than_ms`, but none with a
        transaction open."""
        expired = [
            pid
            for pid, e in self.producers.items()
            if e.last_timestamp < older_than_ms and e.current_txn_first_offset == NO_TXN
        ]
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
                last.last_seq if last else NO_SEQUENCE,
                last.last_offset if last else -1,
                last.last_offset - last.base_offset if last else 0,
                e.last_timestamp,
                e.coordinator_epoch,
                e.current_txn_first_offset,
            )
            for e in self.producers.values()
            for last in (e.batches[-1] if e.batches else None,)
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
        fsync_if_exists(self.snapshot_path(offset))

    def load(self, first_offset: int, log_end_offset: int) -> int:
        """Load the newest valid snapshot in [first_offset, log_end_offset]; its offset, or -1.

        Snapshots outside the range are deleted, as in Kafka's truncateAndReload (which
        bounds by the log start offset, not the first segment): one above describes a
        lost tail, one below misses the batches of removed segments.
        """
        self.clear()
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
                self.clear()
                path.unlink()
        return -1

    def _read_snapshot(self, path: Path) -> None:
        for entry in parse_snapshot(path.read_bytes()):
            self.producers[entry.producer_id] = entry
            if entry.current_txn_first_offset != NO_TXN:
                self.ongoing_txns[entry.current_txn_first_offset] = entry.producer_id
        self.ongoing_txns = dict(sorted(self.ongoing_txns.items()))

    def clear(self) -> None:
        self.producers.clear()
        self.ongoing_txns.clear()
        self.unreplicated_txns.clear()
        self._verifications.clear()

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


def parse_snapshot(data: bytes) -> list[ProducerStateEntry]:
    """The entries of a snapshot's bytes, in either layout; ValueError if it is damaged."""
    if len(data) < _HEADER.size:
        raise ValueError(f"{len(data)} bytes is shorter than the header")
    version, crc, count = _HEADER.unpack_from(data)
    if version != _VERSION or crc32c(data[6:]) != crc:
        raise ValueError(f"version {version} or CRC mismatch")
    body = data[_HEADER.size :]
    entries = []
    if len(body) == count * _ENTRY.size:
        for (
            pid,
            epoch,
            last_seq,
            last,
            delta,
            ts,
            coordinator_epoch,
            txn_first,
        ) in _ENTRY.iter_unpack(body):
            entry = ProducerStateEntry(
                pid,
                epoch,
                last_timestamp=ts,
                coordinator_epoch=coordinator_epoch,
                current_txn_first_offset=txn_first,
            )
            if last >= 0:
                first_seq = (last_seq - delta) % (INT32_MAX + 1) if last_seq >= 0 else last_seq
                entry.batches.append(BatchMetadata(first_seq, last_seq, last - delta, last, ts))
            entries.append(entry)
    elif len(body) == count * _OLD_ENTRY.size:
        for pid, epoch, first_seq, last_seq, base, last, ts in _OLD_ENTRY.iter_unpack(body):
            entry = ProducerStateEntry(pid, epoch, last_timestamp=ts)
            entry.batches.append(BatchMetadata(first_seq, last_seq, base, last, ts))
            entries.append(entry)
    else:
        raise ValueError(f"size {len(data)} does not match {count} entries")
    return entries
