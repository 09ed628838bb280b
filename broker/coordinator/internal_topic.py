"""`InternalTopic`: a topic the brokers themselves write and replay (`__consumer_offsets`,
`__remote_log_metadata`).

Records are built with the record builder and appended like a client's, with acks=all:
an append returns once the partition's ISR has it, so what it stored survives the loss
of its leader. A partition led here is appended to directly; one led by another broker
gets a Produce request sent to its leader. Replay reads this broker's replica; `fetch`
reads any partition as a consumer does, from its leader (see `fetch`). The topic
is created on first use with its own configs, its replication factor capped at the live
brokers (as Kafka creates `__consumer_offsets`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Mapping

from kio.schema.fetch.v17 import request as fetch_request
from kio.schema.produce.v9 import request as produce_request
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import Records, i8, i16, i32, i32Timedelta, i64

from tierbroker.broker.metadata.topic_admin import TopicAdmin
from tierbroker.broker.network.broker_client import BrokerClient, BrokerUnavailable
from tierbroker.broker.network.inter_broker import InterBrokerClients
from tierbroker.broker.replication.replica_manager import ReplicaManager
from tierbroker.broker.replication.transaction_verification import TransactionSupportedOperation
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import (
    BatchView,
    build_batch,
    decode_batch,
    decode_records,
    iter_batches,
    whole_batches_size,
)
from tierbroker.storage.log import AppendOptions, AppendOrigin, now_ms
from tierbroker.storage.topic_partition import TopicPartition

_READ_BYTES = 1 << 20
# No long poll: a broker answers a connection's requests in order, and one fetch per
# metadata partition shares the connection to its leader; the reader paces its polls.
_FETCH_MAX_WAIT_MS = 0


class InternalTopic:
    def __init__(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        replicas: ReplicaManager,
        admin: TopicAdmin,
        timeout_ms: int = 30_000,
    ) -> None:
        self.name = name
        self._partitions = num_partitions
        self.replication_factor = replication_factor
        self.configs = dict(configs)
        self.replicas = replicas
        self.admin = admin
        self.timeout_ms = timeout_ms
        self._clients = InterBrokerClients(
            replicas.config.inter_broker, admin.cache, f"broker-{replicas.broker_id}", timeout_ms
        )

    @property
    def num_partitions(self) -> int:
        return self.admin.cache.partition_count(self.name) or self._partitions

    @property
    def exists(self) -> bool:
        return self.name in self.admin.cache.topics

    async def ensure_created(self) -> None:
        if self.exists:
            return
        try:
            await self.admin.create_topic(
                self.name,
                self._partitions,
                self.replication_factor,
                self.configs,
                max_replication_factor=self.replication_factor,
                timeout_s=self.timeout_ms / 1000,
            )
        except KafkaError as e:
            if e.code != ErrorCode.topic_already_exists:
                raise

    async def append_records(
        self, partition: int, records: list[tuple[bytes, bytes | None]]
    ) -> int:
        """Append records in one batch, acks=all; the first one's offset. Raises with the
        append's error (NOT_LEADER_OR_FOLLOWER when no broker leads the partition)."""
        await self.ensure_created()
        tp = TopicPartition(self.name, partition)
        batch = build_batch([(key, value, [], now_ms()) for key, value in records])
        leader = self.admin.cache.leader(tp)
        if leader == self.replicas.broker_id:
            result = (await self.replicas.append_records({tp: batch}, -1, self.timeout_ms))[tp]
            if result.error != ErrorCode.none:
                raise KafkaError(result.error, f"appending to {tp} failed: {result.error.name}")
            return result.base_offset
        return await self._forward(tp, leader, batch)

    async def append_transactional(
        self,
        partition: int,
        records: list[tuple[bytes, bytes | None]],
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        operation: TransactionSupportedOperation,
    ) -> int:
        """Append records in a producer's transaction (offsets a transaction commits), as the
        partition's leader, acks=all, once the transaction's coordinator confirms (or adds)
        the partition; its marker makes them count. Raises NOT_LEADER_OR_FOLLOWER if the
        partition is not led here."""
        tp = TopicPartition(self.name, partition)
        batch = build_batch(
            [(key, value, [], now_ms()) for key, value in records],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=0,
            is_transactional=True,
        )
        options = AppendOptions(transactional_id, AppendOrigin.COORDINATOR)
        appended = await self.replicas.append_records(
            {tp: batch}, -1, self.timeout_ms, options, operation
        )
        result = appended[tp]
        if result.error != ErrorCode.none:
            raise KafkaError(result.error, f"appending to {tp} failed: {result.error.name}")
        return result.base_offset

    def _client(self, tp: TopicPartition, leader: int) -> BrokerClient:
        client = self._clients.for_broker(leader)
        if client is None:
            raise KafkaError(ErrorCode.not_leader_or_follower, f"{tp} has no live leader")
        return client

    async def _forward(self, tp: TopicPartition, leader: int, batch: bytes) -> int:
        client = self._client(tp, leader)
        request = produce_request.ProduceRequest(
            transactional_id=None,
            acks=i16(-1),
            timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=self.timeout_ms)),
            topic_data=(
                produce_request.TopicProduceData(
                    name=TopicName(tp.topic),
                    partition_data=(
                        produce_request.PartitionProduceData(
                            index=i32(tp.partition), records=Records(batch)
                        ),
                    ),
                ),
            ),
        )
        try:
            response = await client.send(request)
        except BrokerUnavailable as e:
            raise KafkaError(ErrorCode.not_leader_or_follower, f"{tp}: {e}") from e
        answer = response.responses[0].partition_responses[0]
        if answer.error_code != ErrorCode.none:
            code = ErrorCode(answer.error_code)
            raise KafkaError(code, f"appending to {tp} at broker {leader} failed: {code.name}")
        return int(answer.base_offset)

    async def fetch(
        self, partition: int, start_offset: int
    ) -> tuple[list[tuple[int, bytes, bytes | None]], int]:
        """(offset, key, value) of the keyed records from `start_offset` up to the high
        watermark of the partition's leader, and that high watermark: what a consumer
        reads. A partition led here is read from the local replica (its high watermark is
        the leader's); another is fetched over the wire from its leader as a consumer
        (replica id -1), answered at once. Raises KafkaError
        (NOT_LEADER_OR_FOLLOWER while no broker leads it) for the caller to retry."""
        tp = TopicPartition(self.name, partition)
        leader = self.admin.cache.leader(tp)
        if leader == self.replicas.broker_id:
            log_ = self.replicas.partition_or_error(tp).log
            return list(self.read(partition, start_offset)), log_.high_watermark
        assignment = self.admin.cache.topics.get(self.name)
        if assignment is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"{self.name} is not created")
        request = fetch_request.FetchRequest(
            replica_state=fetch_request.ReplicaState(
                replica_id=BrokerId(-1), replica_epoch=i64(-1)
            ),
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=_FETCH_MAX_WAIT_MS)),
            min_bytes=i32(1),
            max_bytes=i32(_READ_BYTES),
            isolation_level=i8(0),
            topics=(
                fetch_request.FetchTopic(
                    topic_id=assignment.topic_id,
                    partitions=(
                        fetch_request.FetchPartition(
                            partition=i32(partition),
                            current_leader_epoch=i32(-1),
                            fetch_offset=i64(start_offset),
                            last_fetched_epoch=i32(-1),
                            log_start_offset=i64(-1),
                            partition_max_bytes=i32(_READ_BYTES),
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
        )
        try:
            response = await self._client(tp, leader).send(request)
        except BrokerUnavailable as e:
            raise KafkaError(ErrorCode.not_leader_or_follower, f"{tp}: {e}") from e
        if response.error_code != ErrorCode.none:
            code = ErrorCode(response.error_code)
            raise KafkaError(code, f"fetching {tp} from broker {leader} failed: {code.name}")
        data = response.responses[0].partitions[0]
        if data.error_code != ErrorCode.none:
            code = ErrorCode(data.error_code)
            raise KafkaError(code, f"fetching {tp} from broker {leader} failed: {code.name}")
        records = [
            (r.offset, r.key, r.value)
            for r in decode_records(bytes(data.records or b""))
            if r.offset >= start_offset and r.key is not None
        ]
        return records, int(data.high_watermark)

    def read(
        self, partition: int, start_offset: int = 0, to_log_end: bool = False
    ) -> Iterator[tuple[int, bytes, bytes | None]]:
        """(offset, key, value) of the keyed records of this broker's replica, from
        `start_offset` to the high watermark (to the log end with `to_log_end`: a new
        leader replays all it has, which is what its clients see next); markers left out."""
        for batch, records in self.read_batches(partition, start_offset, to_log_end):
            if not batch.is_control:
                yield from records

    def read_batches(
        self, partition: int, start_offset: int = 0, to_log_end: bool = False
    ) -> Iterator[tuple[BatchView, list[tuple[int, bytes, bytes | None]]]]:
        """As `read`, batch by batch, with each batch's header (its producer, whether it is
        transactional or a marker)."""
        if not self.exists:
            return
        log_ = self.replicas.partition_or_error(TopicPartition(self.name, partition)).log
        offset = max(start_offset, log_.log_start_offset)
        end = log_.log_end_offset if to_log_end else log_.high_watermark
        while offset < end:
            data = log_.read(offset, _READ_BYTES, end, min_one_batch=True)
            if data.records is None:
                return
            buffer = data.records.read()
            batches = list(iter_batches(memoryview(buffer)[: whole_batches_size(buffer)]))
            if not batches:
                return
            for batch in batches:  # by batch: a cleaned log has emptied ones, and gaps
                yield (
                    batch,
                    [
                        (record.offset, record.key, record.value)
                        for record in decode_batch(batch).records
                        if record.offset >= offset and record.key is not None
                    ],
                )
            offset = batches[-1].next_offset

    async def close(self) -> None:
        await self._clients.close()


class RemoteLogMetadataTopic:
    """`__remote_log_metadata` as the topic-based RLMM's `MetadataTopic`."""

    NAME = "__remote_log_metadata"
    CONFIGS: Mapping[str, str] = {"retention.ms": "-1", "segment.bytes": "104857600"}

    def __init__(
        self,
        num_partitions: int,
        replication_factor: int,
        replicas: ReplicaManager,
        admin: TopicAdmin,
        brokers_may_join: bool = False,
    ) -> None:
        """`brokers_may_join`: other processes' brokers join the cluster (a ZooKeeper
        store), so the brokers live at start may be too few for the replication factor."""
        self.topic = InternalTopic(
            self.NAME, num_partitions, replication_factor, self.CONFIGS, replicas, admin
        )
        self.brokers_may_join = brokers_may_join

    @property
    def num_partitions(self) -> int:
        return self.topic.num_partitions

    async def ensure_created(self) -> None:
        """Create the topic, unless brokers may still join and fewer are live than its
        replication factor: the brokers of such a cluster start one by one, and the first
        would create it on itself alone, where the others would never see its events."""
        if not self._too_few_brokers():
            await self.topic.ensure_created()

    async def append(self, partition: int, key: bytes, value: bytes) -> int:
        """Append an event; until the topic can be created with its replication factor,
        NOT_ENOUGH_REPLICAS (copies wait and retry, as Kafka's manager waits to start)."""
        if not self.topic.exists and self._too_few_brokers():
            raise KafkaError(
                ErrorCode.not_enough_replicas,
                f"{self.NAME} is created once {self.topic.replication_factor} brokers are live "
                f"(remote.log.metadata.topic.replication.factor), "
                f"{len(self.topic.admin.cache.brokers)} are",
            )
        await self.topic.ensure_created()
        return await self.topic.append_records(partition, [(key, value)])

    def _too_few_brokers(self) -> bool:
        live = len(self.topic.admin.cache.brokers)
        return self.brokers_may_join and live < self.topic.replication_factor

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        return self.topic.read(partition, start_offset)

    async def fetch(
        self, partition: int, start_offset: int
    ) -> tuple[list[tuple[int, bytes, bytes | None]], int]:
        return await self.topic.fetch(partition, start_offset)

    def follow(self, on_records: Callable[[int], None]) -> None:
        name = self.NAME

        def progressed(tp: TopicPartition) -> None:
            if tp.topic == name:
                on_records(tp.partition)

        self.topic.replicas.progress_listeners.append(progressed)

    async def close(self) -> None:
        await self.topic.close()
