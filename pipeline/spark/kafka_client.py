"""The brokers' side of a `tierbroker` read (`kafka.bootstrap.servers` set), through librdkafka.

The planner asks the brokers for topics, partitions, log start and end offsets and
offsets by timestamp (`BrokerMetadata`); an executor reads one offset range of one
partition with its own consumer (`read_range`), from the closest replica when
`client.rack` is set (KIP-392). The consumer is assigned partitions and never joins
or commits to its group, like the consumers of Spark's Kafka source.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 30.0
CONSUME_BATCH = 10_000


class DataLossError(Exception):
    """Offsets the plan counted on are no longer on the brokers."""


def _consumer(config: Mapping[str, str], **extra: Any) -> Consumer:
    return Consumer({**config, "enable.auto.commit": False, **extra})


class BrokerMetadata:
    """Topics, partitions and offsets, as the brokers answer them (for planning)."""

    def __init__(self, config: Mapping[str, str]) -> None:
        self._consumer = _consumer(config)

    def close(self) -> None:
        self._consumer.close()

    def topics(self) -> dict[str, list[int]]:
        """Every topic but internal ones (`__...`), with its partitions."""
        metadata = self._consumer.list_topics(timeout=METADATA_TIMEOUT_S)
        return {
            name: sorted(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and not name.startswith("__")
        }

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions; none if the brokers do not know it."""
        metadata = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return []
        return sorted(found.partitions)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start offset, high watermark) of the partition."""
        low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
        )
        return int(low), int(high)

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The first offset whose timestamp is >= `timestamp_ms` (ListOffsets); None if none."""
        (found,) = self._consumer.offsets_for_times(
            [TopicPartition(topic, partition, timestamp_ms)], timeout=METADATA_TIMEOUT_S
        )
        if found.error is not None:
            raise KafkaException(found.error)
        return None if found.offset < 0 else int(found.offset)


def _offset(message: Any) -> int:
    """The offset of a record, or the end offset of a partition-EOF event (always set)."""
    offset: int | None = message.offset()
    if offset is None:
        raise ValueError(f"a message without an offset: {message.error()}")
    return offset


def read_range(
    config: Mapping[str, str],
    topic: str,
    partition: int,
    start: int,
    end: int,
    poll_timeout_ms: int,
    fail_on_data_loss: bool,
) -> Iterator[list[Any]]:
    """The records of offsets [start, end) of a partition, in lists of librdkafka messages.

    Stops at `end`, or when the brokers report their end at or past it (the last
    offsets may be transaction markers, which are not records). Raises
    `DataLossError` if `start` is out of range (deleted by retention) and
    `fail_on_data_loss`; otherwise reading resumes at the log start. Raises
    TimeoutError after `poll_timeout_ms` without a record.
    """
    consumer = _consumer(
        config,
        **{
            "enable.partition.eof": True,
            "auto.offset.reset": "error" if fail_on_data_loss else "earliest",
        },
    )
    where = f"{topic}-{partition}"
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        waiting_since = time.monotonic()
        while True:
            records: list[Any] = []
            done = False
            for message in consumer.consume(CONSUME_BATCH, timeout=0.5):
                error = message.error()
                if error is None:
                    offset = _offset(message)
                    if offset >= end:
                        done = True
                        break
                    if offset >= start:
                        records.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    done = done or _offset(message) >= end  # the end the broker has
                elif error.code() in (
                    KafkaError._AUTO_OFFSET_RESET,
                    KafkaError.OFFSET_OUT_OF_RANGE,
                ):
                    raise DataLossError(
                        f"{where}: offset {start} is no longer on the brokers (deleted by "
                        f"retention?): {error.str()}; set failOnDataLoss=false to skip it"
                    )
                else:
                    raise KafkaException(error)
            if records:
                waiting_since = time.monotonic()
                yield records
                done = done or records[-1].offset() >= end - 1
            if done:
                return
            if time.monotonic() - waiting_since > poll_timeout_ms / 1000:
                raise TimeoutError(
                    f"{where}: no record for {poll_timeout_ms} ms reading offsets "
                    f"{start}..{end - 1} through the brokers (kafkaConsumer.pollTimeoutMs)"
                )
    finally:
        consumer.close()
