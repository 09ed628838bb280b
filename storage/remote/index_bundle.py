"""The indexes of one remote segment packed in one object, as Aiven's plugin does (its
format differs: it keeps each index's position in its manifest).

A segment then costs three writes (log, indexes, manifest), not one per index on
top, and a reader gets every index of a segment with one GET. Layout (big-endian)::

    version int8 (1) | count int8 | count x (index type int8, size int32) | the indexes

Index types are numbered as Kafka's `RemoteStorageManager.IndexType` enum orders
them; the indexes follow the table in its order.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path

from tierbroker.storage.remote.storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)

VERSION = 1
CODES = {
    IndexType.OFFSET: 0,
    IndexType.TIMESTAMP: 1,
    IndexType.PRODUCER_SNAPSHOT: 2,
    IndexType.TRANSACTION: 3,
    IndexType.LEADER_EPOCH: 4,
}
TYPES = {code: index_type for index_type, code in CODES.items()}
_HEADER = struct.Struct(">bb")
_ENTRY = struct.Struct(">bi")


def pack_indexes(indexes: Mapping[IndexType, bytes]) -> bytes:
    table = b"".join(_ENTRY.pack(CODES[t], len(data)) for t, data in indexes.items())
    return _HEADER.pack(VERSION, len(indexes)) + table + b"".join(indexes.values())


def read_index_bundle(data: LogSegmentData) -> bytes:
    """The bundle of a segment's indexes, read from their files (blocking: run it off the loop)."""
    return pack_indexes(
        {
            index_type: source.read_bytes() if isinstance(source, Path) else source
            for index_type, source in data.indexes().items()
        }
    )


def unpack_indexes(bundle: bytes) -> dict[IndexType, bytes]:
    """The indexes in `bundle`; ValueError if it is not one."""
    if len(bundle) < _HEADER.size:
        raise ValueError(f"an index bundle of {len(bundle)} bytes has no header")
    version, count = _HEADER.unpack_from(bundle)
    if version != VERSION:
        raise ValueError(f"index bundle version {version}, expected {VERSION}")
    if count < 0:
        raise ValueError(f"index bundle of {count} indexes")
    position = _HEADER.size + count * _ENTRY.size
    if len(bundle) < position:
        raise ValueError(f"index bundle of {len(bundle)} bytes is shorter than its table")
    indexes = {}
    for code, size in _ENTRY.iter_unpack(bundle[_HEADER.size : position]):
        index_type = TYPES.get(code)
        if index_type is None or index_type in indexes or size < 0:
            raise ValueError(f"index bundle entry (type {code}, {size} bytes) is not valid")
        if position + size > len(bundle):
            raise ValueError(f"index bundle entry (type {code}, {size} bytes) is past its end")
        indexes[index_type] = bundle[position : position + size]
        position += size
    # The table accounts for every byte: anything after the last index is damage.
    if position != len(bundle):
        raise ValueError(f"index bundle has {len(bundle) - position} bytes after its indexes")
    return indexes


def index_from_bundle(key: str, bundle: bytes, index_type: IndexType) -> bytes:
    """One index out of the bundle stored at `key`, for `RemoteStorageManager.fetch_index`."""
    try:
        indexes = unpack_indexes(bundle)
    except ValueError as e:
        raise RemoteStorageError(f"{key}: {e}", retriable=False) from None
    if index_type not in indexes:
        raise RemoteResourceNotFoundError(f"{key} has no {index_type.value} index")
    return indexes[index_type]
