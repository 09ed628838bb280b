"""`check_bounds` agrees with kio on every request schema, and refuses impossible counts."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import Records

from broker.handlers import HANDLERS
from protocol.bounds import check_bounds
from protocol.codec import parse_request, supported_versions
from protocol.errors import ErrorCode, KafkaError

HANDLED = [
    0,
    1,
    2,
    3,
    8,
    9,
    10,
    11,
    12,
    13,
    14,
    15,
    16,
    18,
    19,
    20,
    21,
    22,
    23,
    32,
    33,
    35,
    37,
    42,
    44,
    47,
    60,
    61,
    75,
]
st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

SCHEMAS = [
    load_request_schema(key, version)
    for key in sorted(HANDLERS)
    for version in range(supported_versions()[key][0], supported_versions()[key][1] + 1)
]


@pytest.mark.parametrize(
    "schema", SCHEMAS, ids=lambda s: f"{s.__module__.split('.')[2]}-v{s.__version__}"
)
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_bounds_walk_ends_where_kio_does(schema: type, data: st.DataObject) -> None:
    entity = data.draw(st.from_type(schema))
    buffer = io.BytesIO()
    entity_writer(schema)(buffer, entity)
    encoded = buffer.getvalue()
    assert check_bounds(schema, encoded, 0) == len(encoded)


def test_huge_compact_array_is_refused_before_kio_reads_it() -> None:
    # Produce v9: null transactional id, acks 1, timeout 5000, topics claiming 2^32-2 elements.
    header = struct.pack(">hhih", 0, 9, 1, 0) + b"\x00"
    frame = header + bytes.fromhex("00000100001388ffffffff0f")
    with pytest.raises(KafkaError) as refused:
        parse_request(frame)
    assert refused.value.code == ErrorCode.invalid_request
    assert "cannot fit" in str(refused.value)


def test_trailing_bytes_are_ignored_as_kafka_does() -> None:
    header = struct.pack(">hhih", 3, 1, 7, 0)  # Metadata v1, client id ""
    request = parse_request(header + struct.pack(">i", -1) + b"\x00\x00\x00")
    assert request.correlation_id == 7 and request.body.topics is None
