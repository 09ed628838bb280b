"""`index_bundle`: a segment's indexes in one object, packed and read back."""

from __future__ import annotations

import struct

import pytest

from tierbroker.storage.remote.index_bundle import index_from_bundle, pack_indexes, unpack_indexes
from tierbroker.storage.remote.storage_manager import (
    IndexType,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)

INDEXES = {
    IndexType.OFFSET: struct.pack(">ii", 0, 0) + struct.pack(">ii", 40, 4096),
    IndexType.TIMESTAMP: struct.pack(">qi", 1_700_000_000_000, 39),
    IndexType.PRODUCER_SNAPSHOT: b"",  # present and empty is not absent
    IndexType.LEADER_EPOCH: b"0\n1\n3 0\n",
}


def test_round_trip_keeps_each_index_and_only_those_given() -> None:
    assert unpack_indexes(pack_indexes(INDEXES)) == INDEXES
    assert unpack_indexes(pack_indexes({})) == {}


def test_the_header_is_version_count_then_type_and_size_per_index() -> None:
    bundle = pack_indexes({IndexType.TIMESTAMP: b"t" * 12, IndexType.OFFSET: b"o" * 8})
    # Kafka's IndexType order numbers the types: OFFSET 0, TIMESTAMP 1.
    assert bundle == b"\x01\x02" + struct.pack(">bi", 1, 12) + struct.pack(">bi", 0, 8) + (
        b"t" * 12 + b"o" * 8
    )


@pytest.mark.parametrize(
    "bundle",
    [
        b"",
        b"\x01",
        b"\x02\x00",  # an unknown version
        b"\x01\x02" + struct.pack(">bi", 0, 0),  # a table shorter than its count
        b"\x01\x01" + struct.pack(">bi", 9, 0),  # an unknown index type
        b"\x01\x01" + struct.pack(">bi", 0, 9) + b"short",  # past the end
        b"\x01\x01" + struct.pack(">bi", 0, -1),
        b"\x01\xff",  # a negative count
        b"\x01\x02" + struct.pack(">bi", 0, 1) * 2 + b"ab",  # the same index twice
        b"\x01\x01" + struct.pack(">bi", 0, 1) + b"a" + b"trailing",
    ],
    ids=[
        "empty",
        "half-header",
        "version",
        "table",
        "type",
        "overrun",
        "negative-size",
        "negative-count",
        "duplicate",
        "trailing",
    ],
)
def test_a_damaged_bundle_is_refused(bundle: bytes) -> None:
    with pytest.raises(ValueError):
        unpack_indexes(bundle)
    with pytest.raises(RemoteStorageError, match=r"k\.indexes"):
        index_from_bundle("k.indexes", bundle, IndexType.OFFSET)


def test_an_index_the_bundle_lacks_is_not_found() -> None:
    bundle = pack_indexes(INDEXES)
    assert index_from_bundle("k", bundle, IndexType.OFFSET) == INDEXES[IndexType.OFFSET]
    with pytest.raises(RemoteResourceNotFoundError, match="txnindex"):
        index_from_bundle("k", bundle, IndexType.TRANSACTION)
