"""`check_bounds` agrees with kio on every request schema, refuses impossible counts, and
refuses a null wherever the schema does not allow one."""

from __future__ import annotations

import dataclasses
import io
import struct
from datetime import timedelta
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import Records

from tests.integration.wire import encode_request
from tierbroker.broker.handlers import HANDLERS
from tierbroker.protocol.bounds import check_bounds
from tierbroker.protocol.codec import parse_request
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.versions import SUPPORTED_VERSIONS

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
    for version in range(SUPPORTED_VERSIONS[key][0], SUPPORTED_VERSIONS[key][1] + 1)
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


@pytest.mark.parametrize("size", [0, 11, 14, 20])
def test_a_tagged_field_must_be_the_size_its_tag_declares(size: int) -> None:
    """kio reads a known tag's value whatever size the tag declares, so a tag declaring
    less or more than its value would have kio read on from other bytes than the bounds
    walk (a fuzzed Fetch v18 of that kind made kio allocate 28 GB and abort)."""
    schema = load_request_schema(1, 18)
    entity = schema(
        max_wait=timedelta(0), min_bytes=1, max_bytes=1, isolation_level=0,
        session_id=0, session_epoch=-1, topics=(), forgotten_topics_data=(), rack_id="",
    )  # fmt: skip
    body = io.BytesIO()
    entity_writer(schema)(body, entity)
    assert body.getvalue().endswith(b"\x00")  # no tagged fields
    # ReplicaState (tag 1): replica id, replica epoch and its own empty tagged fields.
    replica_state = struct.pack(">iq", 1, 5) + b"\x00"
    value = replica_state.ljust(size, b"\x00")[: max(size, 0)]
    tagged = body.getvalue()[:-1] + bytes([1, 1, size]) + value
    with pytest.raises(KafkaError) as refused:
        check_bounds(schema, tagged, 0)
    assert refused.value.code == ErrorCode.invalid_request
    exact = body.getvalue()[:-1] + bytes([1, 1, len(replica_state)]) + replica_state
    assert check_bounds(schema, exact, 0) == len(exact)


def test_trailing_bytes_are_ignored_as_kafka_does() -> None:
    header = struct.pack(">hhih", 3, 1, 7, 0)  # Metadata v1, client id ""
    request = parse_request(header + struct.pack(">i", -1) + b"\x00\x00\x00")
    assert request.correlation_id == 7 and request.body.topics is None


def null_violations(entity: Any) -> list[str]:
    """Fields of `entity` (and the entities in it) that are None where the schema forbids it."""
    found = []
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        nullable = get_origin(f.type) in (UnionType, Union) and NoneType in get_args(f.type)
        if value is None and not nullable:
            found.append(f"{type(entity).__name__}.{f.name}")
        for item in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(item):
                found += null_violations(item)
    return found


NULLS = (b"\x00", b"\xff\xff", b"\xff\xff\xff\xff")  # compact, int16 and int32 nulls


@pytest.mark.parametrize(
    "schema", SCHEMAS, ids=lambda s: f"{s.__module__.split('.')[2]}-v{s.__version__}"
)
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_length_mutated_to_null_is_refused_or_allowed_by_the_schema(
    schema: type, data: st.DataObject
) -> None:
    frame = encode_request(data.draw(st.from_type(schema)), correlation_id=1)
    body_offset = check_bounds(schema.__header_schema__, frame, 0, header=True)
    for position in range(body_offset, len(frame)):
        for null in NULLS:
            mutated = frame[:position] + null + frame[position + len(null) :]
            try:
                request = parse_request(mutated)
            except KafkaError:
                continue
            assert not null_violations(request.body), (position, null, request.body)
