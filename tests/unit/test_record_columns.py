"""`record_columns` (`protocol/records/_columns.c`): a batch's records as Arrow buffers,
against the full decoder, and the Spark source's columns built either way."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from tierbroker.pipeline.spark import read
from tierbroker.pipeline.spark.read import Columns
from tierbroker.pipeline.spark.source import KAFKA_SCHEMA_WITHOUT_HEADERS
from tierbroker.protocol.records import (
    BatchView,
    Compression,
    TimestampType,
    build_batch,
    decode_batch,
)
from tierbroker.protocol.records.builder import RecordInput
from tierbroker.protocol.records.codecs import decompress

try:
    from tierbroker.protocol.records._columns import record_columns
except ImportError:  # pragma: no cover - the message says what to do
    pytest.fail("protocol/records/_columns.c is not built: run `pip install -e .`", pytrace=False)

FAST = settings(max_examples=200, deadline=None)
NOW_MS = 1_700_000_000_000
BASE = 1000

_payloads = st.none() | st.binary(max_size=40) | st.binary(min_size=100, max_size=300)
_headers = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=12)), max_size=3)
_records = st.lists(
    st.tuples(_payloads, _payloads, _headers, st.integers(NOW_MS - 10**9, NOW_MS + 10**6)),
    min_size=1,
    max_size=12,
)
_kinds = st.sampled_from(TimestampType)


def batch_of(
    records: list[RecordInput], codec: Compression, kind: TimestampType = TimestampType.CREATE_TIME
) -> BatchView:
    return BatchView(build_batch(records, base_offset=BASE, compression=codec, timestamp_type=kind))


def binary(rows: int, validity: bytes | None, offsets: bytes, data: bytes) -> list[bytes | None]:
    bitmap = None if validity is None else pa.py_buffer(validity)
    array = pa.Array.from_buffers(
        pa.binary(), rows, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return array.to_pylist()  # type: ignore[no-any-return]


@FAST
@given(_records, st.sampled_from(Compression), _kinds, st.integers(0, 12), st.integers(0, 12))
def test_the_columns_hold_what_the_decoder_reads(
    records: list[RecordInput], codec: Compression, kind: TimestampType, skip: int, keep: int
) -> None:
    view = batch_of(records, codec, kind)
    first, last = BASE + skip, BASE + skip + keep - 1
    decoded = [r for r in decode_batch(view).records if first <= r.offset <= last]
    payload = view.records_payload()
    if codec is not Compression.NONE:
        payload = decompress(codec, payload)
    append = view.max_timestamp if kind is TimestampType.LOG_APPEND_TIME else None
    rows, offsets, stamps, kv, ko, kd, vv, vo, vd = record_columns(
        payload, view.record_count, view.base_offset, view.base_timestamp, append, first, last
    )
    assert rows == len(decoded)
    assert list(memoryview(offsets).cast("q")) == [r.offset for r in decoded]
    assert list(memoryview(stamps).cast("q")) == [r.timestamp for r in decoded]
    assert binary(rows, kv, ko, kd) == [r.key for r in decoded]
    assert binary(rows, vv, vo, vd) == [r.value for r in decoded]
    assert (kv is None) == all(r.key is not None for r in decoded)


@FAST
@given(st.lists(st.tuples(_records, st.sampled_from(Compression), _kinds), min_size=1, max_size=4))
def test_the_source_builds_the_same_batch_from_buffers_or_from_records(
    batches: list[tuple[list[RecordInput], Compression, TimestampType]],
) -> None:
    schema = to_arrow_schema(KAFKA_SCHEMA_WITHOUT_HEADERS, timezone="UTC")
    native, parsed = Columns("t", 3, schema), Columns("t", 3, schema)
    parsed.native = False
    for records, codec, kind in batches:
        view = batch_of(records, codec, kind)
        for columns in (native, parsed):
            columns.extend_batch(view, BASE + 1, BASE + 10)
    assert native.rows == parsed.rows
    if native.rows:
        assert native.take().equals(parsed.take())


def test_a_malformed_records_section_is_refused_naming_the_record() -> None:
    view = batch_of([(b"k", b"value", [], NOW_MS)] * 3, Compression.NONE)
    payload = bytes(view.records_payload())
    with pytest.raises(ValueError, match="record 2 at byte"):
        record_columns(payload[:-3], 3, BASE, NOW_MS, None, 0, 2**62)
    with pytest.raises(ValueError, match="left in the records section"):
        record_columns(payload + b"\x00", 3, BASE, NOW_MS, None, 0, 2**62)


def test_the_extension_is_what_the_source_uses() -> None:
    assert read.record_columns is record_columns
