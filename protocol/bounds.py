"""`check_bounds`: a structural pass over a request before kio decodes it.

kio's native reader trusts declared lengths: a compact array that claims 2^32
elements makes it allocate that much and abort the process. Kafka's generated
readers refuse a count larger than the bytes left. This pass walks the same
schema (kio's dataclasses: their field types and `kafka_type` metadata, so nothing
is hand-written per API), reads only lengths and counts, and raises
`KafkaError(INVALID_REQUEST)` when one cannot fit in the rest of the frame, or is
null (-1) where the field is not nullable: kio would hand a handler `None` for a
non-nullable array, where Kafka's readers refuse the request. A tagged field kio
knows is decoded by it too, so it is walked as well, and must fill the size its tag
declares exactly.
Records and bytes are skipped, never read.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from tierbroker.protocol.errors import ErrorCode, KafkaError

_FIXED_SIZES = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}

# A field step: (kind, kafka_type or entity type, nullable, field name).
Step = tuple[str, Any, bool, str]


class _Cursor:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf, self.pos, self.end = buf, pos, len(buf)

    def fail(self, what: str) -> KafkaError:
        return KafkaError(ErrorCode.invalid_request, f"{what} at byte {self.pos} of {self.end}")

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise self.fail(f"field of {n} bytes does not fit")
        self.pos += n

    def int_be(self, size: int) -> int:
        if self.pos + size > self.end:
            raise self.fail("truncated length")
        value = int.from_bytes(self.buf[self.pos : self.pos + size], "big", signed=True)
        self.pos += size
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            if self.pos >= self.end or shift > 28:
                raise self.fail("bad varint")
            byte = self.buf[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7


@cache
def _steps(entity_type: type, header: bool) -> tuple[tuple[Step, ...], bool]:
    """The non-tagged fields of an entity as steps, and whether it is flexible."""
    steps = tuple(
        _step(entity_type, f, header)
        for f in dataclasses.fields(entity_type)
        if "tag" not in f.metadata
    )
    return steps, bool(getattr(entity_type, "__flexible__"))  # noqa: B009


@cache
def _tagged_steps(entity_type: type) -> dict[int, Step]:
    """The tagged fields of an entity as steps, by tag."""
    return {
        int(f.metadata["tag"]): _step(entity_type, f, False)
        for f in dataclasses.fields(entity_type)
        if "tag" in f.metadata
    }


def _step(entity_type: type, f: dataclasses.Field[Any], header: bool) -> Step:
    nullable = _nullable(f.type)
    name = f"{entity_type.__name__}.{f.name}"
    element, array = _element_type(f.type)
    if dataclasses.is_dataclass(element):
        return ("entity_array" if array else "entity", element, nullable, name)
    kafka_type = f.metadata["kafka_type"]  # on every primitive field kio generates
    if header and f.name == "client_id":
        kafka_type = "legacy_string"  # always a legacy string, as Kafka special-cases it
    return ("array" if array else "primitive", kafka_type, nullable, name)


def _element_type(field_type: Any) -> tuple[Any, bool]:
    """A field's type without `| None`, and whether it is an array (`tuple[X, ...]`)."""
    if get_origin(field_type) in (UnionType, Union):
        (field_type,) = (t for t in get_args(field_type) if t is not NoneType)
    if get_origin(field_type) is tuple:
        return get_args(field_type)[0], True
    return field_type, False


def _nullable(field_type: Any) -> bool:
    """Whether the field itself may be null (`X | None`), not its array's elements."""
    return get_origin(field_type) in (UnionType, Union) and NoneType in get_args(field_type)


def check_bounds(
    entity_type: type, buf: bytes | memoryview, offset: int, header: bool = False
) -> int:
    """Walk `entity_type` over `buf` from `offset`; the offset after it. Raises on overflow."""
    cursor = _Cursor(buf, offset)
    _entity(cursor, entity_type, header)
    return cursor.pos


def _entity(c: _Cursor, entity_type: type, header: bool = False) -> None:
    steps, flexible = _steps(entity_type, header)
    for step in steps:
        _field(c, step, flexible)
    if not flexible:
        return
    tagged = _tagged_steps(entity_type)
    for _ in range(c.uvarint()):
        tag, size = c.uvarint(), c.uvarint()
        known = tagged.get(tag)
        if known is not None:
            # kio decodes a known tag's value whatever size the tag declares: the value must
            # be exactly that size, or kio would read on from elsewhere than this walk.
            value = _Cursor(c.buf, c.pos)
            value.end = min(c.end, c.pos + size)
            _field(value, known, flexible)
            if value.pos != c.pos + size:
                raise c.fail(f"tagged field {known[3]} of {size} bytes holds {value.pos - c.pos}")
        c.skip(size)


def _field(c: _Cursor, step: Step, flexible: bool) -> None:
    kind, what, nullable, name = step
    if kind == "primitive":
        _primitive(c, what, flexible, nullable, name)
    elif kind == "entity":
        if nullable and c.int_be(1) < 0:
            return
        _entity(c, what)
    else:
        count = _array_count(c, flexible)
        if count > c.end - c.pos:
            raise c.fail(f"array of {count} elements cannot fit")
        if count < 0 and not nullable:
            raise c.fail(f"null in non-nullable array {name}")
        for _ in range(count):
            if kind == "entity_array":
                _entity(c, what)
            else:
                _primitive(c, what, flexible, False, name)


def _array_count(c: _Cursor, flexible: bool) -> int:
    return c.uvarint() - 1 if flexible else c.int_be(4)


def _primitive(c: _Cursor, kafka_type: str, flexible: bool, nullable: bool, name: str) -> None:
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        c.skip(size)
        return
    if kafka_type == "legacy_string" or (kafka_type == "string" and not flexible):
        length = c.int_be(2)
    elif kafka_type in ("string", "bytes", "records") and flexible:
        length = c.uvarint() - 1
    elif kafka_type in ("bytes", "records"):
        length = c.int_be(4)
    else:
        raise c.fail(f"unknown field type {kafka_type!r}")
    if length < 0 and not nullable:
        raise c.fail(f"null in non-nullable {kafka_type} {name}")
    c.skip(max(length, 0))
