"""The client side of the wire: encode requests and decode responses with kio's schemas.

Brokers use it to talk to each other (followers fetch from leaders, writes to internal
topics go to their leaders). An ApiVersions response is read with response header v0
whatever its version, as every Kafka client does.
"""

from __future__ import annotations

import io
import struct
from functools import cache
from typing import Any

from kio.index import load_payload_module, load_request_schema
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from tierbroker.protocol.errors import ErrorCode, KafkaError

API_VERSIONS = 18
_SIZE = struct.Struct(">i")
_CORRELATION_ID = struct.Struct(">i")


@cache
def request_type(api_key: int, api_version: int) -> Any:
    return load_request_schema(api_key, api_version)


@cache
def response_type(api_key: int, api_version: int) -> Any:
    module = load_payload_module(api_key, api_version, EntityType.response)
    return next(
        value
        for value in vars(module).values()
        if getattr(value, "__type__", None) == EntityType.response
    )


def encode_request(correlation_id: int, client_id: str, body: Any) -> bytes:
    """A size-prefixed request frame for the kio request entity `body`."""
    header_type = type(body).__header_schema__
    header_fields = {
        "request_api_key": type(body).__api_key__,
        "request_api_version": type(body).__version__,
        "correlation_id": correlation_id,
    }
    if "client_id" in {f for f in header_type.__dataclass_fields__}:
        header_fields["client_id"] = client_id
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    entity_writer(header_type)(buffer, header_type(**header_fields))
    entity_writer(type(body))(buffer, body)
    frame = buffer.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    return bytes(frame)


def response_correlation_id(frame: bytes | memoryview) -> int:
    """The correlation id every response header starts with."""
    return int(_CORRELATION_ID.unpack_from(frame)[0])


def decode_response(api_key: int, api_version: int, frame: bytes | memoryview) -> Any:
    """The response entity of a frame (without its size prefix)."""
    body_type = response_type(api_key, api_version)
    header_type = body_type.__header_schema__
    try:
        if api_key == API_VERSIONS:
            offset = _CORRELATION_ID.size  # header v0: the correlation id alone
        else:
            _, offset = entity_reader(header_type)(frame, 0)
        body: Any = entity_reader(body_type)(frame, offset)[0]
    except Exception as e:  # kio raises assorted errors on malformed input
        raise KafkaError(
            ErrorCode.corrupt_message,
            f"malformed api_key {api_key} v{api_version} response: {type(e).__name__}: {e}",
        ) from e
    return body
