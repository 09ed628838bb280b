"""Record-level validation of a client's batch: `BatchView.validate(from_client=True)` and
`validation.validate_records`, against the builder, the full decoder and each malformation."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cramjam
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.forged_batches import encode_record as record
from tests.forged_batches import forge_batch
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import (
    BatchView,
    Compression,
    InvalidRecordError,
    TimestampType,
    build_batch,
    decode_batch,
    validate_records,
    validation,
)
from tierbroker.protocol.records.builder import RecordInput, _write_varint
from tierbroker.protocol.records.codecs import XERIAL_MAGIC
from tierbroker.protocol.records.validation import walk_records
from tierbroker.storage.log import Log, now_ms
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_partition import TopicPartition

FAST = settings(max_examples=200, deadline=None)
NOW_MS = 1_700_000_000_000
UNBOUNDED = 2**63 - 1

try:
    from tierbroker.protocol.records._walk import walk_records as compiled_walk
except ImportError:  # pragma: no cover - the message says what to do
    pytest.fail("protocol/records/_walk.c is not built: run `pip install -e .`", pytrace=False)

_payloads = st.none() | st.binary(max_size=40) | st.binary(min_size=100, max_size=300)
_headers = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=12)), max_size=3)
_records = st.lists(
    st.tuples(_payloads, _payloads, _headers, st.integers(NOW_MS - 10**9, NOW_MS + 10**6)),
    min_size=1,
    max_size=10,
)


def check(
    batch: bytes | bytearray,
    *,
    log_append_time: bool = False,
    before_ms: int = UNBOUNDED,
    after_ms: int = UNBOUNDED,
) -> int:
    """Validate `batch` as the produce path does; its largest record timestamp."""
    view = BatchView(bytearray(batch))
    view.validate(from_client=True)
    return validate_records(
        view,
        now_ms=NOW_MS,
        log_append_time=log_append_time,
        timestamp_before_max_ms=before_ms,
        timestamp_after_max_ms=after_ms,
    )


def refused(batch: bytes | bytearray, **options: int | bool) -> ErrorCode:
    with pytest.raises(InvalidRecordError) as refusal:
        check(batch, **options)  # type: ignore[arg-type]
    return refusal.value.code


def section(records: list[RecordInput]) -> bytes:
    """The uncompressed records section the builder writes for `records`."""
    return bytes(build_batch(records)[61:])


def rebuild(body: bytes, *, count: int, **fields: Any) -> bytearray:
    return forge_batch(
        body, count=count, timestamp_ms=fields.pop("base_timestamp", NOW_MS), **fields
    )


# Valid batches -------------------------------------------------------------------------


@FAST
@given(_records, st.sampled_from(Compression))
def test_every_built_batch_is_accepted_with_its_records_maximum(
    records: list[RecordInput], compression: Compression
) -> None:
    assert check(build_batch(records, compression=compression)) == max(r[3] for r in records)


@FAST
@given(_records)
def test_the_compiled_walk_reads_what_the_python_walk_reads(records: list[RecordInput]) -> None:
    body = section(records)
    deltas = [r[3] - records[0][3] for r in records]
    expected = (min(deltas), max(deltas))
    assert walk_records(body, 0, len(body), len(records)) == expected
    assert compiled_walk(body, 0, len(body), len(records)) == expected


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        pytest.param(record(headers=[(b"h", b"\x00")]), True, id="header value ends in 0"),
        pytest.param(  # the header count is cut off: its length ends at the value's 0
            record(value=b"a\x00", length_error=-1)[:-1], False, id="value's 0 ends it"
        ),
        pytest.param(record(length_error=1) + b"\x00", False, id="a 0 after its fields"),
        pytest.param(record(value=b"", length_error=1) + b"\x00", False, id="empty value"),
    ],
)
def test_a_record_ending_in_a_zero_byte_is_read_field_by_field(body: bytes, valid: bool) -> None:
    # The compiled walk takes a last byte of 0 right after the value as "no headers".
    outcomes = []
    for walk in (walk_records, compiled_walk):
        try:
            outcomes.append(walk(body, 0, len(body), 1) == (0, 0))
        except (ValueError, IndexError):
            outcomes.append(False)
    assert outcomes == [valid, valid]


@FAST
@given(_records, st.sampled_from(Compression))
def test_the_pure_python_fallback_validates_as_the_compiled_walk(
    records: list[RecordInput], compression: Compression
) -> None:
    # Where the extension cannot be built, validate_records walks in Python.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validation, "_WALK", walk_records)
        assert check(build_batch(records, compression=compression)) == max(r[3] for r in records)
        malformed = rebuild(section(records), count=len(records) + 1, compression=compression)
        assert refused(malformed) == ErrorCode.invalid_record


def test_an_uncompressed_batch_is_walked_where_it_lies_in_the_request() -> None:
    first = build_batch([(None, b"a", [], NOW_MS)])
    second = build_batch([(b"k", b"b" * 300, [("h", b"v")], NOW_MS + 5)] * 3)
    request = bytearray(first + second)
    view = BatchView(request, len(first))
    view.validate(from_client=True)
    assert validate_records(
        view,
        now_ms=NOW_MS,
        log_append_time=False,
        timestamp_before_max_ms=UNBOUNDED,
        timestamp_after_max_ms=UNBOUNDED,
    ) == (NOW_MS + 5)


# Malformations with a valid CRC: hypothesis ------------------------------------------


def structurally_valid(batch: bytearray) -> bool:
    """The independent oracle: the full decoder reads it and the offsets run 0..count-1."""
    view = BatchView(batch)
    try:
        decoded = decode_batch(view)
    except InvalidRecordError as exc:
        # The decoder stops at a header key that is not UTF-8, which Kafka keeps as
        # bytes, so it cannot judge the rest: such examples are left out.
        assume(not isinstance(exc.__cause__, UnicodeDecodeError))
        return False
    return [r.offset for r in decoded.records] == list(range(view.record_count))


_mutations = st.sampled_from(["flip", "insert", "delete", "truncate", "append"])


def mutate(body: bytes, kind: str, index: int, byte: int) -> bytes:
    if not body:
        return bytes([byte])
    index %= len(body)
    match kind:
        case "flip":
            return body[:index] + bytes([body[index] ^ (byte or 1)]) + body[index + 1 :]
        case "insert":
            return body[:index] + bytes([byte]) + body[index:]
        case "delete":
            return body[:index] + body[index + 1 :]
        case "truncate":
            return body[:index]
    return body + bytes([byte])


@settings(max_examples=600, deadline=None)
@given(
    _records,
    st.sampled_from(Compression),
    st.lists(st.tuples(_mutations, st.integers(0, 2**16), st.integers(0, 255)), max_size=3),
)
def test_a_mutated_records_section_is_refused_exactly_when_it_is_malformed(
    records: list[RecordInput],
    compression: Compression,
    mutations: list[tuple[str, int, int]],
) -> None:
    body = section(records)
    for kind, index, byte in mutations:
        body = mutate(body, kind, index, byte)
    batch = rebuild(body, count=len(records), compression=compression)
    if structurally_valid(bytearray(batch)):
        check(batch)
    else:
        assert refused(batch) == ErrorCode.invalid_record
    python_outcome: object
    python_keyless: list[int] = []  # on a refusal too: the well-formed records before it
    try:
        python_outcome = walk_records(body, 0, len(body), len(records), python_keyless)
    except (ValueError, IndexError):
        python_outcome = "refused"
    compiled_keyless: list[int] = []
    try:
        compiled_outcome: object = compiled_walk(body, 0, len(body), len(records), compiled_keyless)
    except ValueError:
        compiled_outcome = "refused"
    assert (compiled_outcome, compiled_keyless) == (python_outcome, python_keyless)


@FAST
@given(_records, st.sampled_from(Compression), st.integers(-3, 3).filter(bool))
def test_a_record_count_that_disagrees_with_the_records_is_refused(
    records: list[RecordInput], compression: Compression, error: int
) -> None:
    count = len(records) + error
    if count < 1:
        count = len(records) + 1
    batch = rebuild(section(records), count=count, compression=compression)
    assert refused(batch) == ErrorCode.invalid_record


# Malformations, one by one -----------------------------------------------------------


def test_a_last_offset_delta_past_the_records_is_refused() -> None:
    # The report's case: one record that moved the high watermark by 100,000.
    batch = rebuild(record(), count=1, last_offset_delta=99_999)
    assert refused(batch) == ErrorCode.invalid_record


def test_a_negative_or_zero_record_count_is_refused() -> None:
    assert refused(rebuild(b"", count=0, last_offset_delta=0)) == ErrorCode.invalid_record
    assert refused(rebuild(record(), count=-1, last_offset_delta=-2)) == ErrorCode.invalid_record


@pytest.mark.parametrize("error", [-2, -1, 1, 2])
def test_a_record_length_that_lies_is_refused(error: int) -> None:
    body = record(0) + record(1, length_error=error) + record(2)
    assert refused(rebuild(body, count=3)) == ErrorCode.invalid_record


def test_bytes_after_the_last_record_are_refused() -> None:
    assert refused(rebuild(record(0) + b"\x00", count=1)) == ErrorCode.invalid_record


@pytest.mark.parametrize("deltas", [[1], [0, 0], [0, 2], [1, 0], [0, 1, 1]])
def test_offset_deltas_out_of_sequence_are_refused(deltas: list[int]) -> None:
    body = b"".join(record(d) for d in deltas)
    assert refused(rebuild(body, count=len(deltas))) == ErrorCode.invalid_record


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(record(key=None) + b"", id="valid null key: control"),
        pytest.param(record(headers=[(b"h", None)]), id="valid null header value: control"),
    ],
)
def test_null_keys_and_header_values_are_records(body: bytes) -> None:
    check(rebuild(body, count=1))


def _with_length(field: str, length: int) -> bytes:
    """A record whose key, value or header key length says `length` (no bytes follow)."""
    body = bytearray(b"\x00\x00\x00")  # attributes, timestampDelta, offsetDelta
    lengths = {"key": -1, "value": -1, "header_key": None}
    lengths[field] = length
    _write_varint(body, lengths["key"] or 0)
    _write_varint(body, lengths["value"] or 0)
    if lengths["header_key"] is None:
        _write_varint(body, 0)
    else:
        _write_varint(body, 1)
        _write_varint(body, lengths["header_key"])
        _write_varint(body, -1)
    out = bytearray()
    _write_varint(out, len(body))
    return bytes(out + body)


@pytest.mark.parametrize(
    ("field", "length"),
    [("key", -2), ("value", -5), ("key", 1), ("value", 40), ("header_key", -1), ("header_key", 3)],
)
def test_key_value_and_header_lengths_out_of_bounds_are_refused(field: str, length: int) -> None:
    assert refused(rebuild(_with_length(field, length), count=1)) == ErrorCode.invalid_record


def test_a_header_count_larger_than_the_record_is_refused() -> None:
    body = bytearray(b"\x00\x00\x00\x01\x01")  # null key, null value
    _write_varint(body, 1000)
    out = bytearray()
    _write_varint(out, len(body))
    assert refused(rebuild(bytes(out + body), count=1)) == ErrorCode.invalid_record


def test_an_overlong_varint_is_refused() -> None:
    body = b"\x14\x00" + b"\xff" * 10 + b"\x00" * 8  # a timestampDelta of 11 bytes
    assert refused(rebuild(body, count=1)) == ErrorCode.invalid_record


def test_a_control_batch_from_a_client_is_refused() -> None:
    batch = build_batch([(b"\x00\x00\x00\x00", b"", [], NOW_MS)], is_control=True)
    assert refused(batch) == ErrorCode.invalid_record


def test_an_idempotent_batch_without_a_sequence_is_refused() -> None:
    batch = rebuild(record(), count=1, producer=(7, 0, -1))
    assert refused(batch) == ErrorCode.invalid_record
    check(rebuild(record(), count=1, producer=(7, 0, 0)))


def test_a_corrupt_compressed_payload_is_corrupt() -> None:
    batch = rebuild(b"", count=1, compression=Compression.ZSTD, raw_payload=b"not zstd at all")
    assert refused(batch) == ErrorCode.corrupt_message


def _xerial(data: bytes) -> bytes:
    """Snappy in xerial framing, as the Java client writes it: two blocks."""
    half = len(data) // 2
    blocks = (bytes(cramjam.snappy.compress_raw(part)) for part in (data[:half], data[half:]))
    return XERIAL_MAGIC + bytes(8) + b"".join(len(b).to_bytes(4, "big") + b for b in blocks)


@pytest.mark.parametrize(
    "codec", [*(c for c in Compression if c is not Compression.NONE), "xerial"]
)
def test_a_compressed_batch_may_not_expand_past_its_bound(
    codec: Compression | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = section([(None, bytes(2000), [], NOW_MS)] * 20)
    if codec == "xerial":
        batch = rebuild(b"", count=20, compression=Compression.SNAPPY, raw_payload=_xerial(body))
    else:
        batch = rebuild(body, count=20, compression=Compression(codec))
    monkeypatch.setattr(validation, "max_uncompressed_bytes", lambda _size: len(body) - 1)
    assert refused(batch) == ErrorCode.message_too_large
    monkeypatch.setattr(validation, "max_uncompressed_bytes", lambda _size: len(body))
    check(batch)


@pytest.mark.parametrize(
    "codec", [c for c in Compression if c is not Compression.NONE], ids=lambda c: c.name.lower()
)
def test_batches_of_changing_expansion_share_the_buffer_without_mixing(codec: Compression) -> None:
    # Decompression reuses one buffer sized by the previous batch: a batch that expands
    # further is still read whole, and a shorter one after it never reads what the
    # longer one left behind.
    short = [(None, b"a", [], NOW_MS)]
    long = [(None, bytes(5000), [], NOW_MS + i) for i in range(200)]  # about 1000:1
    assert check(build_batch(short, compression=codec)) == NOW_MS
    assert check(build_batch(long, compression=codec)) == NOW_MS + 199
    missing = rebuild(section(short), count=2, compression=codec)
    assert refused(missing) == ErrorCode.invalid_record
    assert check(build_batch(short * 3, compression=codec)) == NOW_MS


def test_a_large_buffer_is_kept_only_while_batches_need_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(validation, "_KEEP_SCRATCH_BYTES", 1 << 20)
    large = build_batch([(None, bytes(1 << 20), [], NOW_MS)] * 2, compression=Compression.ZSTD)
    small = build_batch([(None, b"v", [], NOW_MS)], compression=Compression.ZSTD)
    check(large)
    check(large)
    assert len(validation._SCRATCH.buffer) > 2 << 20  # a run of large batches keeps it
    check(small)
    assert len(validation._SCRATCH.buffer) <= 1 << 20
    check(large)
    bomb = bytes(cramjam.zstd.compress(bytes(80 << 20)))
    assert refused(rebuild(b"", count=1, compression=Compression.ZSTD, raw_payload=bomb)) == (
        ErrorCode.message_too_large
    )
    assert len(validation._SCRATCH.buffer) <= 1 << 20  # nor does a refused one


def test_the_expansion_bound_is_64_times_the_batch_and_at_least_64_mib() -> None:
    assert validation.max_uncompressed_bytes(100) == 64 << 20
    assert validation.max_uncompressed_bytes(4 << 20) == 256 << 20


def test_a_zstd_bomb_is_refused_at_the_bound() -> None:
    bomb = bytes(cramjam.zstd.compress(bytes(80 << 20)))  # a few KiB
    batch = rebuild(b"", count=1, compression=Compression.ZSTD, raw_payload=bomb)
    assert refused(batch) == ErrorCode.message_too_large


def _client_lz4(data: bytes, *, block_id: int = 4, content_size: bool = False) -> bytes:
    """An LZ4 frame as the Java client and librdkafka write it: independent blocks, no
    block or content checksums; a block that does not shrink is stored as it is."""
    block_bytes = 1 << (8 + 2 * block_id)
    descriptor = bytes([0x68 if content_size else 0x60, block_id << 4])
    if content_size:
        descriptor += len(data).to_bytes(8, "little")
    frame = bytearray(b"\x04\x22\x4d\x18" + descriptor)
    frame.append(validation._lz4_header_checksum(descriptor))
    for start in range(0, len(data), block_bytes):
        chunk = data[start : start + block_bytes]
        packed = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        stored = len(packed) >= len(chunk)
        frame += (len(chunk) | 1 << 31 if stored else len(packed)).to_bytes(4, "little")
        frame += chunk if stored else packed
    return bytes(frame + bytes(4))


_lz4_sections = st.builds(  # (records section, record count)
    lambda records, random_value: (
        section([*records, (None, random_value, [], NOW_MS)]),
        len(records) + 1,
    ),
    _records,
    st.binary(min_size=0, max_size=70_000),  # incompressible: a stored block
)


@FAST
@given(_lz4_sections, st.sampled_from([4, 5]), st.booleans())
def test_lz4_frames_as_clients_write_them_are_read_block_by_block(
    body_and_count: tuple[bytes, int], block_id: int, content_size: bool
) -> None:
    body, count = body_and_count
    frame = _client_lz4(body, block_id=block_id, content_size=content_size)
    assert bytes(cramjam.lz4.decompress(frame)) == body  # liblz4 agrees: a valid frame
    assert validation._lz4_client_frame(memoryview(frame)) is not None
    read = validation._SCRATCH.decompress(Compression.LZ4, memoryview(frame), len(body))
    assert bytes(read) == body
    read.release()
    check(rebuild(b"", count=count, compression=Compression.LZ4, raw_payload=frame))


@settings(max_examples=300, deadline=None)
@given(
    _lz4_sections,
    st.lists(
        st.tuples(_mutations, st.integers(0, 8) | st.integers(0, 2**20), st.integers(0, 255)),
        min_size=1,
        max_size=3,
    ),
)
def test_a_mutated_lz4_frame_gets_the_frame_decoders_answer(
    body_and_count: tuple[bytes, int], mutations: list[tuple[str, int, int]]
) -> None:
    body, count = body_and_count
    frame = _client_lz4(body)
    for kind, index, byte in mutations:
        frame = mutate(frame, kind, index, byte)
    batch = rebuild(b"", count=count, compression=Compression.LZ4, raw_payload=frame)

    def outcome() -> object:
        try:
            return check(batch)
        except InvalidRecordError as exc:
            return exc.code

    block_by_block = outcome()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validation, "_lz4_client_frame", lambda _data: None)
        assert outcome() == block_by_block


@pytest.mark.parametrize(
    ("at", "value"),
    [(4, 0x70), (4, 0x40), (5, 0x30), (6, None), (-1, 1)],
    ids=["block checksums", "linked blocks", "no block size", "header checksum", "end mark"],
)
def test_an_unusual_or_broken_lz4_frame_is_left_to_the_frame_decoder(
    at: int, value: int | None
) -> None:
    frame = bytearray(_client_lz4(section([(None, b"v" * 500, [], NOW_MS)])))
    frame[at] = frame[at] ^ 1 if value is None else value
    assert validation._lz4_client_frame(memoryview(frame)) is None


def test_an_lz4_frame_past_the_bound_is_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    body = section([(None, bytes(2000), [], NOW_MS)] * 100)
    batch = rebuild(b"", count=100, compression=Compression.LZ4, raw_payload=_client_lz4(body))
    monkeypatch.setattr(validation, "max_uncompressed_bytes", lambda _size: len(body) - 1)
    assert refused(batch) == ErrorCode.message_too_large
    monkeypatch.setattr(validation, "max_uncompressed_bytes", lambda _size: len(body))
    assert check(batch) == NOW_MS


# Timestamps -------------------------------------------------------------------------


def test_timestamps_within_the_bounds_are_accepted_at_the_edges() -> None:
    body = record(0, timestamp_delta=-1000) + record(1, timestamp_delta=500)
    assert check(rebuild(body, count=2), before_ms=1000, after_ms=500) == NOW_MS + 500


@pytest.mark.parametrize(("delta", "before", "after"), [(-1001, 1000, 500), (501, 1000, 500)])
def test_a_timestamp_outside_the_bounds_is_refused(delta: int, before: int, after: int) -> None:
    body = record(0) + record(1, timestamp_delta=delta)
    batch = rebuild(body, count=2)
    assert refused(batch, before_ms=before, after_ms=after) == ErrorCode.invalid_timestamp
    check(batch, log_append_time=True, before_ms=before, after_ms=after)  # not checked there


def test_the_after_bound_defaults_to_one_hour_as_in_kafka() -> None:
    config = LogConfig()
    assert config.message_timestamp_after_max_ms == 3_600_000
    assert config.message_timestamp_before_max_ms == UNBOUNDED


def test_records_without_a_timestamp_are_exempt() -> None:
    batch = rebuild(record(0) + record(1), count=2, base_timestamp=-1, max_timestamp_ms=-1)
    assert check(batch, before_ms=0, after_ms=0) == -1


def test_a_producer_may_not_set_log_append_time() -> None:
    batch = rebuild(record(), count=1, attributes=TimestampType.LOG_APPEND_TIME << 3)
    assert refused(batch, log_append_time=True) == ErrorCode.invalid_timestamp
    no_timestamp = rebuild(record(), count=1, attributes=8, base_timestamp=-1, max_timestamp_ms=-1)
    assert refused(no_timestamp) == ErrorCode.invalid_timestamp


def test_a_lying_max_timestamp_is_replaced_by_the_records_maximum(tmp_path: Path) -> None:
    log = Log(tmp_path / "t-0", TopicPartition("t", 0), LogConfig(), uuid.uuid4())
    now = now_ms()
    body = record(0, timestamp_delta=0) + record(1, timestamp_delta=20)
    log.append_as_leader(
        rebuild(body, count=2, base_timestamp=now, max_timestamp_ms=now + 10**9), 0
    )
    log.update_high_watermark(log.log_end_offset)
    stored_slice = log.read(0, 1 << 20, log.high_watermark, True).records
    assert stored_slice is not None
    stored = BatchView(stored_slice.read())
    stored.validate()
    assert stored.max_timestamp == now + 20
    log.close()


# The log stores nothing of a refused request ------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: rebuild(record(), count=1, last_offset_delta=99_999), id="offsets"),
        pytest.param(lambda: rebuild(record(length_error=1), count=1), id="length"),
        pytest.param(
            lambda: build_batch([(b"\0\0\0\0", b"", [], now_ms())], is_control=True), id="control"
        ),
        pytest.param(
            lambda: build_batch([(None, b"v", [], now_ms() + 2 * 3_600_000)]), id="future"
        ),
    ],
)
def test_a_refused_batch_leaves_the_log_as_it_was(tmp_path: Path, bad: Callable[[], bytes]) -> None:
    log = Log(tmp_path / "t-0", TopicPartition("t", 0), LogConfig(), uuid.uuid4())
    log.append_as_leader(bytearray(build_batch([(None, b"first", [], now_ms())])), 0)
    size = log.active_segment.size
    good = build_batch([(None, b"good", [], now_ms())])
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(bytearray(good + bad()), 0)
    assert (log.log_end_offset, log.active_segment.size) == (1, size)
    log.close()
