"""Requests in, responses out: headers, dispatch to kio's entity types, and records splicing.

A response is encoded as a list of parts, each `bytes` or a `FileRegion`. The fetch
path puts records into a response without copying them: records that live in a log
file are not read at all, and records read from the remote tier are not copied into
the encoded response. The handler asks a `RecordsSplicer` for a placeholder that kio
serialises like any records field, and `encode_response` cuts the response at each
placeholder and puts the records there, with the length prefix rewritten for their size.
"""

from __future__ import annotations

import io
import itertools
import os
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any, BinaryIO, Protocol

from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from kio.serial.writers import write_unsigned_varint
from kio.static.primitive import Records, uvarint

from tierbroker.protocol.bounds import check_bounds
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.versions import SUPPORTED_VERSIONS

_REQUEST_PREFIX = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_INT32 = struct.Struct(">i")
_PLACEHOLDER_BYTES = 16
_PLACEHOLDER_TAG = os.urandom(_PLACEHOLDER_BYTES - 4)


class FileRegion(Protocol):
    """Bytes that live in a file: sent by the network layer, not read by Python."""

    @property
    def file(self) -> BinaryIO: ...
    @property
    def position(self) -> int: ...
    @property
    def length(self) -> int: ...


ResponseBytes = bytes | memoryview  # a response part in memory, written as it is
ResponsePart = ResponseBytes | FileRegion


class UnsupportedVersionError(KafkaError):
    """A request of an API key or version this broker has no schema for."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(
            ErrorCode.unsupported_version,
            f"api_key {api_key} version {api_version} is not supported",
        )
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # a kio request payload entity of this api_key and api_version


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a frame, read before anything else."""
    if len(frame) < _REQUEST_PREFIX.size:
        raise KafkaError(ErrorCode.invalid_request, f"request of {len(frame)} bytes has no header")
    api_key, api_version, correlation_id = _REQUEST_PREFIX.unpack_from(frame)
    return api_key, api_version, correlation_id


@cache
def _request_schema(api_key: int, api_version: int) -> Any:
    """kio's request entity type (kio resolves it by module name on every call)."""
    return load_request_schema(api_key, api_version)


def parse_request(frame: bytes | memoryview) -> Request:
    """Decode a request frame (without its size prefix) into kio entities."""
    api_key, api_version, correlation_id = peek_header(frame)
    low, high = SUPPORTED_VERSIONS.get(api_key, (0, -1))
    if not low <= api_version <= high:
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    request_type = _request_schema(api_key, api_version)
    header_type = request_type.__header_schema__
    # Lengths are checked before kio reads them; trailing bytes are ignored, as in Kafka.
    body_offset = check_bounds(header_type, frame, 0, header=True)
    check_bounds(request_type, frame, body_offset)
    try:
        header, _ = entity_reader(header_type)(frame, 0)
        body, _ = entity_reader(request_type)(frame, body_offset)
    except Exception as e:  # kio raises assorted errors on malformed input
        raise KafkaError(
            ErrorCode.invalid_request,
            f"malformed api_key {api_key} v{api_version} request: {type(e).__name__}: {e}",
        ) from e
    return Request(api_key, api_version, correlation_id, header.client_id, body)


class RecordsSplicer:
    """Placeholders for records fields of one response, each standing for a response part."""

    def __init__(self) -> None:
        self._counter = itertools.count()
        self.regions: dict[bytes, ResponsePart] = {}

    def placeholder(self, records: ResponsePart) -> Records:
        key = _PLACEHOLDER_TAG + next(self._counter).to_bytes(4, "big")
        self.regions[key] = records
        return Records(key)


def encode_response(
    correlation_id: int,
    body: Any,
    splicer: RecordsSplicer | None = None,
) -> list[ResponsePart]:
    """Encode a response entity with its header and size prefix, splicing record sets in."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")  # the size, written below
    header_type = type(body).__header_schema__
    entity_writer(header_type)(buffer, header_type(correlation_id=correlation_id))
    entity_writer(type(body))(buffer, body)
    encoded = buffer.getbuffer()
    if not splicer or not splicer.regions:
        _INT32.pack_into(encoded, 0, len(encoded) - 4)
        return [bytes(encoded)]
    return _splice(bytes(encoded), splicer.regions, type(body).__flexible__)


def _splice(
    encoded: bytes, regions: dict[bytes, ResponsePart], flexible: bool
) -> list[ResponsePart]:
    cuts = sorted((encoded.index(key), region) for key, region in regions.items())
    # kio wrote each placeholder as a 16-byte records field: compact (uvarint 17) or int32 16.
    prefix_bytes = 1 if flexible else 4
    parts: list[ResponsePart] = []
    size = 0
    last = 0
    for position, region in cuts:
        length = len(region) if isinstance(region, ResponseBytes) else region.length
        head = encoded[last : position - prefix_bytes] + _records_length(length, flexible)
        parts += [head, region]
        size += len(head) + length
        last = position + _PLACEHOLDER_BYTES
    parts.append(encoded[last:])
    size += len(encoded) - last
    first = parts[0]
    assert isinstance(first, bytes)
    parts[0] = _INT32.pack(size - 4) + first[4:]
    return parts


def _records_length(length: int, flexible: bool) -> bytes:
    if not flexible:
        return _INT32.pack(length)
    buffer = io.BytesIO()
    write_unsigned_varint(buffer, uvarint(length + 1))
    return buffer.getvalue()


def version_range(api_key: int) -> tuple[int, int] | None:
    return SUPPORTED_VERSIONS.get(api_key)
