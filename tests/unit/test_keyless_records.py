"""A compacted topic refuses records without a key, as Kafka's LogValidator.validateKey:
both record walks (compiled and Python) report the index of each such record,
`validate_records` then refuses the whole batch with INVALID_RECORD and one record error
per keyless record, and `validate_batches` asks for this only when the topic's
cleanup.policy contains compact. The messages are those Apache Kafka 4.3 answers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.forged_batches import encode_record as record
from tests.forged_batches import forge_batch
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import (
    BatchView,
    Compression,
    InvalidRecordError,
    build_batch,
    validate_records,
    validation,
)
from tierbroker.protocol.records._walk import walk_records as compiled_walk
from tierbroker.protocol.records.builder import RecordInput
from tierbroker.protocol.records.validation import RecordValidationError, Walker, walk_records
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_validator import validate_batches
from tierbroker.storage.topic_partition import TopicPartition

NOW_MS = 1_700_000_000_000
UNBOUNDED = 2**63 - 1
WALKS = [pytest.param(compiled_walk, id="compiled"), pytest.param(walk_records, id="python")]
NO_KEY = "Compacted topic cannot accept message without key in topic partition {}"

_records = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=12),  # key: None is null, b"" is a key
        st.none() | st.binary(max_size=200),
        st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=8)), max_size=2),
        st.integers(NOW_MS - 10**6, NOW_MS + 10**6),
    ),
    min_size=1,
    max_size=12,
)


def validate(batch: bytes | bytearray, compacted_partition: str | None) -> int:
    view = BatchView(bytearray(batch))
    view.validate(from_client=True)
    return validate_records(
        view,
        now_ms=NOW_MS,
        log_append_time=False,
        timestamp_before_max_ms=UNBOUNDED,
        timestamp_after_max_ms=UNBOUNDED,
        compacted_partition=compacted_partition,
    )


def kafka_summary(count: int, shown: list[tuple[int, str]]) -> str:
    """Kafka's RecordValidationException message for `count` record errors."""
    errors = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in shown)
    return (
        f"One or more records have been rejected due to {count} record errors in total, "
        f"and only showing the first three errors at most: [{errors}]"
    )


# The walks -----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(_records)
def test_both_walks_report_each_record_without_a_key(records: list[RecordInput]) -> None:
    body = bytes(build_batch(records)[61:])
    expected = [index for index, (key, *_) in enumerate(records) if key is None]
    deltas = walk_records(body, 0, len(body), len(records))
    for walk in (compiled_walk, walk_records):
        keyless: list[int] = []
        assert walk(body, 0, len(body), len(records), keyless) == deltas
        assert keyless == expected
        assert walk(body, 0, len(body), len(records), None) == deltas


@pytest.mark.parametrize("walk", WALKS)
def test_a_keyless_record_is_reported_once_it_is_known_well_formed(walk: Walker) -> None:
    body = record(0, key=None) + record(1, key=None, length_error=1) + record(2, key=None)
    keyless: list[int] = []
    with pytest.raises((ValueError, IndexError)):
        walk(body, 0, len(body), 3, keyless)
    assert keyless == [0]


def test_the_compiled_walk_takes_a_list_or_none_for_the_keyless_records() -> None:
    body = record(0, key=None)
    with pytest.raises(TypeError, match="keyless must be a list"):
        compiled_walk(body, 0, len(body), 1, ())  # type: ignore[arg-type]


# validate_records ----------------------------------------------------------------------


@pytest.fixture(params=["compiled", "python"])
def walker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`validate_records` with the compiled walk, then with the pure Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(validation, "_WALK", walk_records)


@pytest.mark.usefixtures("walker")
@pytest.mark.parametrize("compression", Compression, ids=lambda c: c.name.lower())
def test_a_keyless_record_refuses_its_batch_with_a_record_error_each(
    compression: Compression,
) -> None:
    records: list[RecordInput] = [
        (b"k0", b"a", [], NOW_MS),
        (None, b"b", [], NOW_MS),
        (b"", b"c", [], NOW_MS),  # an empty key is a key
        (None, None, [("h", b"v")], NOW_MS),
    ]
    batch = build_batch(records, compression=compression)
    with pytest.raises(RecordValidationError) as refusal:
        validate(batch, "orders-2")
    errors = [(1, NO_KEY.format("orders-2")), (3, NO_KEY.format("orders-2"))]
    assert refusal.value.code == ErrorCode.invalid_record
    assert refusal.value.record_errors == tuple(errors)
    assert refusal.value.args[0] == kafka_summary(2, errors)
    assert validate(batch, None) == NOW_MS  # the same batch, the topic not compacted


@pytest.mark.usefixtures("walker")
def test_a_batch_of_keyed_records_is_accepted_on_a_compacted_topic() -> None:
    batch = build_batch([(b"k", b"v", [], NOW_MS), (b"", None, [], NOW_MS + 1)])
    assert validate(batch, "t-0") == NOW_MS + 1


def test_every_keyless_record_is_a_record_error_and_the_first_three_are_shown() -> None:
    batch = build_batch([(None, b"v", [], NOW_MS)] * 5)
    with pytest.raises(RecordValidationError) as refusal:
        validate(batch, "t-0")
    errors = [(index, NO_KEY.format("t-0")) for index in range(5)]
    assert refusal.value.record_errors == tuple(errors)
    assert refusal.value.args[0] == kafka_summary(5, errors[:3])


@pytest.mark.usefixtures("walker")
def test_a_malformed_batch_is_refused_as_malformed_whatever_its_keys() -> None:
    # As in Kafka, where reading a malformed record throws before record errors are counted.
    body = record(0, key=None) + record(1, key=None, length_error=1)
    with pytest.raises(InvalidRecordError) as refusal:
        validate(forge_batch(body, count=2, timestamp_ms=NOW_MS), "t-0")
    assert not isinstance(refusal.value, RecordValidationError)
    assert refusal.value.code == ErrorCode.invalid_record


# validate_batches: the topic's cleanup.policy ----------------------------------------------


def _half_keyless() -> bytearray:
    return bytearray(build_batch([(b"k", b"v", [], NOW_MS), (None, b"v", [], NOW_MS)]))


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_a_topic_whose_cleanup_policy_contains_compact_requires_keys(policy: str) -> None:
    config = LogConfig(cleanup_policy=policy)
    with pytest.raises(RecordValidationError) as refusal:
        validate_batches(_half_keyless(), config, NOW_MS, TopicPartition("orders", 2))
    assert refusal.value.record_errors == ((1, NO_KEY.format("orders-2")),)


def test_a_topic_that_is_not_compacted_takes_records_without_a_key() -> None:
    config = LogConfig(cleanup_policy="delete")
    _, batches = validate_batches(_half_keyless(), config, NOW_MS, TopicPartition("t", 0))
    assert [batch.record_count for batch in batches] == [2]
