"""Properties of built batches: `BatchView` accepts them, refuses any corruption of them,
patches them without breaking the CRC, and `decode_batch` reads back what was built."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import (
    BatchView,
    Compression,
    Header,
    InvalidRecordError,
    Record,
    TimestampType,
    build_batch,
    compress,
    decode_batch,
    decode_records,
    decompress,
)
from tierbroker.protocol.records.builder import RecordInput

FAST = settings(max_examples=150, deadline=None)

_payloads = (
    st.none()
    | st.binary(max_size=48)
    # repetitive, so the codecs have something to compress
    | st.builds(
        lambda chunk, times: chunk * times, st.binary(min_size=1, max_size=4), st.integers(1, 300)
    )
)
_headers = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=16)), max_size=4)
_records = st.lists(
    st.tuples(_payloads, _payloads, _headers, st.integers(0, 2**42)), min_size=1, max_size=12
)
_producers = st.one_of(
    st.just({"producer_id": -1, "producer_epoch": -1, "base_sequence": -1}),
    st.fixed_dictionaries(
        {
            "producer_id": st.integers(0, 2**63 - 1),
            "producer_epoch": st.integers(0, 2**15 - 1),
            "base_sequence": st.integers(0, 2**31 - 1),
        }
    ),
)
_options = st.builds(
    lambda producer, **options: {**producer, **options},
    _producers,
    base_offset=st.integers(0, 2**62),
    compression=st.sampled_from(Compression),
    partition_leader_epoch=st.integers(-1, 2**31 - 1),
    is_transactional=st.booleans(),
    is_control=st.booleans(),
    timestamp_type=st.sampled_from(TimestampType),
)


def expected_records(
    records: list[RecordInput], base_offset: int, log_append_time: int | None
) -> tuple[Record, ...]:
    return tuple(
        Record(
            base_offset + delta,
            timestamp if log_append_time is None else log_append_time,
            key,
            value,
            tuple(Header(k, v) for k, v in headers),
        )
        for delta, (key, value, headers, timestamp) in enumerate(records)
    )


def refresh_crc(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))


@FAST
@given(_records, _options)
def test_built_batches_validate_and_decode_to_what_was_built(
    records: list[RecordInput], options: dict[str, Any]
) -> None:
    batch = build_batch(records, **options)
    view = BatchView(batch)
    view.validate()

    decoded = decode_batch(view)

    log_append = options["timestamp_type"] is TimestampType.LOG_APPEND_TIME
    max_timestamp = max(r[3] for r in records)
    assert decoded.records == expected_records(
        records, options["base_offset"], max_timestamp if log_append else None
    )
    assert view.last_offset == options["base_offset"] + len(records) - 1
    assert view.max_timestamp == max_timestamp
    for field in (
        "base_offset",
        "partition_leader_epoch",
        "compression",
        "timestamp_type",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "is_transactional",
        "is_control",
    ):
        assert getattr(decoded, field) == options[field], field
    assert tuple(decode_records(batch)) == decoded.records


@FAST
@given(_records, _options, st.data())
def test_any_byte_flip_in_the_crc_range_is_refused_as_corrupt(
    records: list[RecordInput], options: dict[str, Any], data: st.DataObject
) -> None:
    batch = bytearray(build_batch(records, **options))
    index = data.draw(st.integers(17, len(batch) - 1), label="index")  # crc field onwards
    batch[index] ^= data.draw(st.integers(1, 255), label="xor")

    with pytest.raises(InvalidRecordError) as refused:
        BatchView(batch).validate()
    assert refused.value.code == ErrorCode.corrupt_message


@FAST
@given(_records, st.data())
def test_header_flips_outside_the_crc_range_are_refused_by_size_or_magic(
    records: list[RecordInput], data: st.DataObject
) -> None:
    batch = bytearray(build_batch(records))
    index = data.draw(st.sampled_from([*range(8, 12), 16]), label="index")  # batchLength, magic
    batch[index] ^= data.draw(st.integers(1, 255), label="xor")

    with pytest.raises(InvalidRecordError) as refused:
        BatchView(batch).validate()
    older_magic = index == 16 and batch[16] in (0, 1)
    assert refused.value.code == (
        ErrorCode.unsupported_for_message_format if older_magic else ErrorCode.corrupt_message
    )


@FAST
@given(_records, _options, st.data())
def test_decoding_a_mangled_batch_only_ever_raises_invalid_record(
    records: list[RecordInput], options: dict[str, Any], data: st.DataObject
) -> None:
    """A client can send a well-checksummed batch with nonsense inside it."""
    batch = bytearray(build_batch(records, **options))
    index = data.draw(st.integers(21, len(batch) - 1), label="index")
    batch[index] ^= data.draw(st.integers(1, 255), label="xor")
    refresh_crc(batch)

    try:
        decode_batch(BatchView(batch))
    except InvalidRecordError as exc:
        assert exc.code in (ErrorCode.corrupt_message, ErrorCode.unsupported_for_message_format)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_ids_are_corrupt_not_a_crash(codec_id: int) -> None:
    batch = bytearray(build_batch([(b"k", b"v", [], 1)]))
    batch[22] = codec_id  # low byte of attributes
    refresh_crc(batch)
    view = BatchView(batch)
    view.validate()

    with pytest.raises(InvalidRecordError) as refused:
        decode_batch(view)
    assert refused.value.code == ErrorCode.corrupt_message


@FAST
@given(_records, _options, st.integers(0, 2**62), st.integers(-1, 2**31 - 1))
def test_offset_and_epoch_patches_keep_the_crc(
    records: list[RecordInput], options: dict[str, Any], new_base: int, new_epoch: int
) -> None:
    batch = bytearray(build_batch(records, **options))
    view = BatchView(batch)
    view.set_base_offset(new_base)
    view.set_partition_leader_epoch(new_epoch)

    reread = BatchView(batch)
    reread.validate()
    assert (reread.base_offset, reread.partition_leader_epoch) == (new_base, new_epoch)
    decoded = decode_batch(reread)
    assert [r.offset for r in decoded.records] == list(range(new_base, new_base + len(records)))


@FAST
@given(_records, _options, st.integers(0, 2**42))
def test_log_append_time_stamp_keeps_the_batch_valid(
    records: list[RecordInput], options: dict[str, Any], append_time: int
) -> None:
    batch = bytearray(build_batch(records, **options))
    BatchView(batch).set_log_append_time(append_time)

    reread = BatchView(batch)
    reread.validate()
    decoded = decode_batch(reread)
    assert decoded.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert decoded.compression == options["compression"]
    assert decoded.is_transactional == options["is_transactional"]
    assert {r.timestamp for r in decoded.records} == {append_time}


@FAST
@given(_records, _records, _options, st.data())
def test_decode_records_skips_a_partial_trailing_batch(
    first: list[RecordInput],
    second: list[RecordInput],
    options: dict[str, Any],
    data: st.DataObject,
) -> None:
    one = build_batch(first, **options)
    two = build_batch(second, **{**options, "base_offset": options["base_offset"] + len(first)})
    cut = data.draw(st.integers(0, len(two) - 1), label="cut")

    whole = tuple(decode_records(one + two))
    partial = tuple(decode_records(one + two[:cut]))

    assert len(whole) == len(first) + len(second)
    assert partial == whole[: len(first)]


@FAST
@given(st.sampled_from(Compression), st.binary(max_size=3000) | _payloads.filter(bool))
def test_codecs_round_trip(codec: Compression, data: bytes) -> None:
    assert decompress(codec, memoryview(compress(codec, data))) == data


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
def test_codecs_refuse_garbage(codec: Compression) -> None:
    with pytest.raises(InvalidRecordError) as refused:
        decompress(
            codec,
            b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x09xyz"
            if codec is Compression.SNAPPY
            else b"definitely not compressed",
        )
    assert refused.value.code == ErrorCode.corrupt_message
