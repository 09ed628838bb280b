"""A null (-1 length) in a field Kafka's schema does not make nullable is refused at decode.

Kafka's readers fail to parse such a request and the broker closes the connection;
kio would hand the handler `None`. Built by hand: kio cannot write these requests.
"""

from __future__ import annotations

import struct

import pytest

from tierbroker.protocol.codec import parse_request
from tierbroker.protocol.errors import ErrorCode, KafkaError

NULL_ARRAY = struct.pack(">i", -1)
NULL_STRING = struct.pack(">h", -1)


def header(api_key: int, version: int, flexible: bool = False) -> bytes:
    client_id = struct.pack(">h", 4) + b"test"
    return struct.pack(">hhi", api_key, version, 11) + client_id + (b"\0" if flexible else b"")


def string(value: str) -> bytes:
    return struct.pack(">h", len(value)) + value.encode()


CASES = {
    "OffsetFetch v1 topics": (header(9, 1) + string("g") + NULL_ARRAY, "OffsetFetchRequest.topics"),
    "OffsetCommit v2 topics": (
        header(8, 2)
        + string("g")
        + struct.pack(">i", 1)
        + string("m")
        + struct.pack(">q", -1)
        + NULL_ARRAY,
        "OffsetCommitRequest.topics",
    ),
    "DescribeGroups v0 groups": (header(15, 0) + NULL_ARRAY, "DescribeGroupsRequest.groups"),
    "DeleteGroups v0 groups": (header(42, 0) + NULL_ARRAY, "DeleteGroupsRequest.groups_names"),
    # Flexible: a compact array's length is a uvarint of count + 1, so 0 is null.
    "DescribeProducers v0 topics": (
        header(61, 0, flexible=True) + b"\x00\x00",
        "DescribeProducersRequest.topics",
    ),
    "Fetch v4 topic name": (
        header(1, 4)
        + struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0)
        + struct.pack(">i", 1)
        + NULL_STRING
        + struct.pack(">i", 0),
        "FetchTopic.topic",
    ),
}


@pytest.mark.parametrize("frame, field", CASES.values(), ids=CASES.keys())
def test_a_null_where_the_schema_forbids_it_is_an_invalid_request(frame: bytes, field: str) -> None:
    with pytest.raises(KafkaError) as refused:
        parse_request(frame)
    assert refused.value.code == ErrorCode.invalid_request
    assert "null in non-nullable" in str(refused.value) and field in str(refused.value)


def test_a_null_where_the_schema_allows_it_is_decoded_as_none() -> None:
    # DescribeLogDirs v1: null topics means every topic; a null client id is Kafka's too.
    frame = struct.pack(">hhih", 35, 1, 3, -1) + NULL_ARRAY
    request = parse_request(frame)
    assert request.client_id is None and request.body.topics is None
