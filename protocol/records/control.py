"""End-transaction markers: the control batch a partition leader writes when a transaction
commits or aborts (Kafka's `EndTransactionMarker`, `ControlRecordType`).

One uncompressed batch of one record, 78 bytes in all: attributes transactional and
control, baseSequence -1, the producer's id and epoch. The record's key is
`version int16 (0) | type int16` (0 ABORT, 1 COMMIT), its value
`version int16 (0) | coordinatorEpoch int32`.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records.batch import BatchView, InvalidRecordError
from tierbroker.protocol.records.builder import build_batch
from tierbroker.protocol.records.decoder import decode_batch

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
_CURRENT_VERSION = 0


class ControlRecordType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    control_type: ControlRecordType
    coordinator_epoch: int

    @property
    def is_abort(self) -> bool:
        return self.control_type == ControlRecordType.ABORT


def build_end_txn_marker(
    producer_id: int, producer_epoch: int, marker: EndTxnMarker, timestamp_ms: int
) -> bytes:
    """The control batch of `marker` (offset and leader epoch assigned on append)."""
    key = _KEY.pack(_CURRENT_VERSION, marker.control_type)
    value = _VALUE.pack(_CURRENT_VERSION, marker.coordinator_epoch)
    return build_batch(
        [(key, value, (), timestamp_ms)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
    )


def read_end_txn_marker(batch: BatchView) -> EndTxnMarker | None:
    """The marker a whole control batch holds; None for an emptied one (the cleaner's) or
    another control type (KRaft's, never in a partition's log here)."""
    if batch.record_count == 0:
        return None
    records = decode_batch(batch).records
    key, value = records[0].key, records[0].value
    if key is None or len(key) < _KEY.size:
        raise InvalidRecordError(ErrorCode.corrupt_message, "a control record without its key")
    _, control_type = _KEY.unpack_from(key)
    if control_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        return None
    if value is None or len(value) < _VALUE.size:
        raise InvalidRecordError(ErrorCode.corrupt_message, "a marker without its value")
    _, coordinator_epoch = _VALUE.unpack_from(value)
    return EndTxnMarker(ControlRecordType(control_type), coordinator_epoch)
