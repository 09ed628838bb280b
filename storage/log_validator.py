"""What Kafka's LogValidator does to a producer's batches before the leader stores them.

Every batch is checked, header and records, before anything is written (the records
are walked, not decoded: `validate_records`); maxTimestamp is set to the records' own
largest. Then, if the topic's `compression.type` names a codec and some batch uses
another, the batches are re-encoded with it into a new buffer (`recompress`) and that
buffer is what the log stores; otherwise the request's own buffer is stored and no
record is decompressed beyond what validation needs; benchmarks/recompression.py
measures what re-encoding costs. Pure: safe to run in a worker thread on a buffer no
one else uses (the broker re-encodes large requests there, `LeaderAppends`).
"""

from __future__ import annotations

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import BatchView, InvalidRecordError, iter_batches
from tierbroker.protocol.records.recompress import recompress
from tierbroker.protocol.records.validation import validate_records
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_partition import TopicPartition


def recompresses(records: bytearray, config: LogConfig) -> bool:
    """True if `validate_batches` would re-encode `records` for the topic's codec. Malformed
    records are not: validating them reports what is wrong."""
    codec = config.compression_codec
    if codec is None:
        return False
    try:
        return any(batch.compression is not codec for batch in iter_batches(records))
    except InvalidRecordError:
        return False


def validate_batches(
    records: bytearray, config: LogConfig, now_ms: int, topic_partition: TopicPartition
) -> tuple[bytearray, list[BatchView]]:
    """The buffer to store and its batches: `records` itself, or its batches re-encoded
    with the topic's codec. Raises with Kafka's error code for the first bad batch."""
    batches = list(iter_batches(records))
    if not batches:
        raise KafkaError(ErrorCode.corrupt_message, f"{topic_partition}: empty records")
    log_append_time = config.message_timestamp_type == "LogAppendTime"
    compacted_partition = str(topic_partition) if config.compact else None  # keys required
    for batch in batches:
        batch.validate(config.max_message_bytes, from_client=True)
        max_timestamp = validate_records(
            batch,
            now_ms=now_ms,
            log_append_time=log_append_time,
            timestamp_before_max_ms=config.timestamp_before_max_ms,
            timestamp_after_max_ms=config.timestamp_after_max_ms,
            compacted_partition=compacted_partition,
        )
        if not log_append_time and batch.max_timestamp != max_timestamp:
            batch.set_max_timestamp(max_timestamp)  # as Kafka: the records' own maximum
    codec = config.compression_codec
    if codec is None or all(batch.compression is codec for batch in batches):
        return records, batches
    stored = bytearray()
    for batch in batches:
        stored += (
            batch.payload()
            if batch.compression is codec
            else recompress(batch, codec, config.compression_level)
        )
    batches = list(iter_batches(stored))
    for batch in batches:  # as Kafka, the limit holds for what is stored
        if batch.size_in_bytes > config.max_message_bytes:
            raise InvalidRecordError(
                ErrorCode.message_too_large,
                f"{topic_partition}: batch of {batch.size_in_bytes} bytes once stored as "
                f"{codec.name.lower()} exceeds max.message.bytes {config.max_message_bytes}",
            )
    return stored, batches
