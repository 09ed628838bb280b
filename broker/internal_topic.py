"""`InternalTopic`: a topic the broker itself writes and replays (`__consumer_offsets`,
`__remote_log_metadata`).

Records are built with the record builder and appended through the
ReplicaManager like a client's, so they are stamped, indexed, checkpointed and
recovered the same way; replay decodes them back from the log. The topic is
created on first use with its own configs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from tierbroker.broker.cluster.controller import Controller
from tierbroker.broker.replica_manager import ReplicaManager
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import build_batch, decode_records
from tierbroker.storage.log import now_ms
from tierbroker.storage.topic_partition import TopicPartition

_READ_BYTES = 1 << 20


class InternalTopic:
    def __init__(
        self,
        name: str,
        num_partitions: int,
        configs: Mapping[str, str],
        replicas: ReplicaManager,
        controller: Controller,
    ) -> None:
        self.name = name
        self._partitions = num_partitions
        self.configs = dict(configs)
        self.replicas = replicas
        self.controller = controller

    @property
    def num_partitions(self) -> int:
        topic = self.controller.store.topics.get(self.name)
        return topic.partitions if topic else self._partitions

    @property
    def exists(self) -> bool:
        return self.name in self.controller.store.topics

    def ensure_created(self) -> None:
        if not self.exists:
            self.controller.create_topic(self.name, self._partitions, 1, self.configs)

    def append_records(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> int:
        """Append records in one batch; the first one's offset. Raises with the append's error."""
        self.ensure_created()
        timestamp = now_ms()
        tp = TopicPartition(self.name, partition)
        batch = build_batch([(key, value, [], timestamp) for key, value in records])
        result = self.replicas.append_records({tp: batch})[tp]
        if result.error != ErrorCode.none:
            raise KafkaError(result.error, f"appending to {tp} failed: {result.error.name}")
        return result.base_offset

    def read(
        self, partition: int, start_offset: int = 0
    ) -> Iterator[tuple[int, bytes, bytes | None]]:
        """(offset, key, value) of the keyed records from `start_offset` to the high watermark."""
        if not self.exists:
            return
        log_ = self.replicas.partition_or_error(TopicPartition(self.name, partition)).log
        offset = max(start_offset, log_.log_start_offset)
        while offset < log_.high_watermark:
            data = log_.read(offset, _READ_BYTES, log_.high_watermark, min_one_batch=True)
            if data.records is None:
                return
            last = offset - 1
            for record in decode_records(data.records.read()):
                if record.offset >= offset and record.key is not None:
                    yield record.offset, record.key, record.value
                last = record.offset
            if last < offset:
                return
            offset = last + 1


class RemoteLogMetadataTopic:
    """`__remote_log_metadata` as the topic-based RLMM's `MetadataTopic`."""

    NAME = "__remote_log_metadata"
    CONFIGS: Mapping[str, str] = {"retention.ms": "-1", "segment.bytes": "104857600"}

    def __init__(
        self, num_partitions: int, replicas: ReplicaManager, controller: Controller
    ) -> None:
        self.topic = InternalTopic(self.NAME, num_partitions, self.CONFIGS, replicas, controller)

    @property
    def num_partitions(self) -> int:
        return self.topic.num_partitions

    def ensure_created(self) -> None:
        self.topic.ensure_created()

    async def append(self, partition: int, key: bytes, value: bytes) -> int:
        return self.topic.append_records(partition, [(key, value)])

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        return self.topic.read(partition, start_offset)
