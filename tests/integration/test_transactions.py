"""Transactions through stock clients on one broker process, as Kafka's own tests state
them (TransactionsTest, the research notes' T1 to T6):

- committed records are read by read_committed consumers, aborted ones only by
  read_uncommitted ones; markers take an offset each;
- while a transaction is open, read_committed consumers and ListOffsets stop at the
  last stable offset, which moves when it commits;
- a second producer with the same transactional id fences the first;
- a transaction open past its timeout is aborted by the coordinator;
- consume-transform-produce: offsets sent to the transaction count only once it commits;
- on a tiered topic, read_committed reads of the remote tier leave out the aborted
  transactions, whose markers may still be local only, and an open transaction holds
  back the copy; the broker-free reader, read committed, returns the same records and
  stops before a transaction whose fate the object store cannot prove.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.apache_kafka import run_tool
from tests.integration.broker_process import BrokerProcess
from tests.integration.tiering_helpers import status
from tests.integration.transactional_topic import start_transactional_topic
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient, make, request_module
from tierbroker.pipeline import TieredConsumer
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch

LEGACY_RESOURCES = r"(read|open)_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    from kafka import KafkaProducer

pytestmark = pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning")

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("transactions"),
        {
            "transaction.state.log.num.partitions": "5",
            "offsets.topic.num.partitions": "5",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
            "remote.log.manager.task.interval.ms": "100",
            "log.retention.check.interval.ms": "200",
        },
    ).start()
    yield process
    process.stop()
    assert "Traceback" not in process.log(), process.log()


def topic_of(broker: BrokerProcess, partitions: int = 1) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT_S)
    return name


def producer(broker: BrokerProcess, transactional_id: str, **extra: object) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "transactional.id": transactional_id,
            **extra,
        }
    )
    p.init_transactions(TIMEOUT_S)
    return p


def read(
    broker: BrokerProcess, topic: str, isolation: str, expected: int, partitions: int = 1
) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record read from the start, until `expected` or quiet."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + TIMEOUT_S
    quiet_until = 0.0
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                if len(got) >= expected and time.monotonic() > quiet_until:
                    break
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(message.error())
            got.append((message.offset(), message.value()))
            quiet_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return got


def test_committed_records_are_read_and_aborted_ones_only_uncommitted(
    broker: BrokerProcess,
) -> None:
    topic = topic_of(broker)
    p = producer(broker, f"tx-{topic}")
    p.begin_transaction()
    for i in range(100):
        p.produce(topic, b"committed-%d" % i)
    p.commit_transaction(TIMEOUT_S)
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, b"aborted-%d" % i)
    p.flush(TIMEOUT_S)
    p.abort_transaction(TIMEOUT_S)
    p.begin_transaction()
    p.produce(topic, b"last")
    p.commit_transaction(TIMEOUT_S)

    committed = read(broker, topic, "read_committed", 101)
    assert [v for _, v in committed] == [b"committed-%d" % i for i in range(100)] + [b"last"]
    # Offsets 0-99, the commit marker at 100, 101-150 aborted, its marker at 151.
    assert committed[-1][0] == 152
    everything = read(broker, topic, "read_uncommitted", 151)
    assert len(everything) == 151
    assert sum(1 for _, v in everything if v is not None and v.startswith(b"aborted")) == 50


def test_read_committed_stops_at_an_open_transaction_until_it_commits(
    broker: BrokerProcess,
) -> None:
    topic = topic_of(broker)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, b"before")
    plain.flush(TIMEOUT_S)
    p = producer(broker, f"tx-{topic}")
    p.begin_transaction()
    p.produce(topic, b"undecided")
    p.flush(TIMEOUT_S)
    plain.produce(topic, b"after")  # not transactional: stable, but behind the open one
    plain.flush(TIMEOUT_S)

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"lso-{topic}",
            "isolation.level": "read_committed",
        }
    )
    try:
        tp = TopicPartition(topic, 0)
        assert consumer.get_watermark_offsets(tp, TIMEOUT_S) == (0, 1)  # the LSO
        assert [v for _, v in read(broker, topic, "read_committed", 1)] == [b"before"]
        p.commit_transaction(TIMEOUT_S)
        assert consumer.get_watermark_offsets(tp, TIMEOUT_S) == (0, 4)
        values = [v for _, v in read(broker, topic, "read_committed", 3)]
        assert values == [b"before", b"undecided", b"after"]
    finally:
        consumer.close()


def test_consumer_lag_counts_to_the_lso_read_committed_and_the_end_uncommitted(
    broker: BrokerProcess,
) -> None:
    """A client's lag metrics come from the last stable offset and the high watermark of
    each fetch: librdkafka's `consumer_lag` of a group that committed offset 1, with a
    transaction open at 4 and the log ending at 6, is 3 read_committed and 5 uncommitted."""
    topic = topic_of(broker)
    p = producer(broker, f"tx-{topic}")
    p.begin_transaction()
    for value in (b"c0", b"c1", b"c2"):
        p.produce(topic, value)
    p.commit_transaction(TIMEOUT_S)  # 0-2, its marker at 3
    p.begin_transaction()
    p.produce(topic, b"open-4")
    p.produce(topic, b"open-5")
    p.flush(TIMEOUT_S)
    lags = {}
    for isolation in ("read_committed", "read_uncommitted"):
        seen: list[int] = []

        def stats(report: str, into: list[int] = seen) -> None:
            partition = json.loads(report)["topics"].get(topic, {}).get("partitions", {}).get("0")
            if partition and partition["consumer_lag"] >= 0:
                into.append(partition["consumer_lag"])

        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": f"lag-{topic}",
                "isolation.level": isolation,
                "enable.auto.commit": False,
                "statistics.interval.ms": 100,
                "stats_cb": stats,
            }
        )
        try:
            consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
            consumer.assign([TopicPartition(topic, 0)])
            deadline = time.monotonic() + TIMEOUT_S
            while not seen and time.monotonic() < deadline:
                consumer.poll(0.1)
        finally:
            consumer.close()
        lags[isolation] = seen[-1] if seen else None
    p.abort_transaction(TIMEOUT_S)
    assert lags == {"read_committed": 3, "read_uncommitted": 5}


def test_a_new_producer_with_the_same_id_fences_the_old_one(broker: BrokerProcess) -> None:
    topic = topic_of(broker)
    transactional_id = f"tx-{topic}"
    old = producer(broker, transactional_id)
    old.begin_transaction()
    old.produce(topic, b"zombie")
    old.flush(TIMEOUT_S)
    new = producer(broker, transactional_id)  # aborts the old one's open transaction
    new.begin_transaction()
    new.produce(topic, b"successor")
    new.commit_transaction(TIMEOUT_S)
    with pytest.raises(KafkaException) as raised:
        old.commit_transaction(TIMEOUT_S)
    assert raised.value.args[0].fatal()
    assert [v for _, v in read(broker, topic, "read_committed", 1)] == [b"successor"]


def test_a_transaction_open_past_its_timeout_is_aborted(broker: BrokerProcess) -> None:
    topic = topic_of(broker)
    p = producer(broker, f"tx-{topic}", **{"transaction.timeout.ms": 1000})
    p.begin_transaction()
    p.produce(topic, b"too slow")
    p.flush(TIMEOUT_S)
    time.sleep(3)  # the coordinator checks every 200 ms
    with pytest.raises(KafkaException):
        p.commit_transaction(TIMEOUT_S)
    assert read(broker, topic, "read_committed", 0) == []
    assert [v for _, v in read(broker, topic, "read_uncommitted", 1)] == [b"too slow"]


def test_a_timeout_above_the_maximum_is_refused(broker: BrokerProcess) -> None:
    with pytest.raises(KafkaException) as raised:
        producer(broker, "tx-too-long", **{"transaction.timeout.ms": 3_600_000})
    assert raised.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_offsets_sent_to_a_transaction_count_once_it_commits(broker: BrokerProcess) -> None:
    source, sink = topic_of(broker), topic_of(broker)
    feeder = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        feeder.produce(source, b"in-%d" % i)
    feeder.flush(TIMEOUT_S)
    group = f"ctp-{source}"
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([source])
    p = producer(broker, f"tx-{source}")
    try:
        taken = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(taken) < 5 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                taken.append(message)
        assert len(taken) == 5
        p.begin_transaction()
        for message in taken:
            p.produce(sink, message.value().replace(b"in", b"out"))
        position = [TopicPartition(source, 0, taken[-1].offset() + 1)]
        p.send_offsets_to_transaction(position, consumer.consumer_group_metadata(), TIMEOUT_S)
        p.abort_transaction(TIMEOUT_S)
        assert consumer.committed([TopicPartition(source, 0)], TIMEOUT_S)[0].offset < 0
        p.begin_transaction()
        for message in taken:
            p.produce(sink, message.value().replace(b"in", b"out"))
        p.send_offsets_to_transaction(position, consumer.consumer_group_metadata(), TIMEOUT_S)
        p.commit_transaction(TIMEOUT_S)
        assert consumer.committed([TopicPartition(source, 0)], TIMEOUT_S)[0].offset == 5
    finally:
        consumer.close()
    assert [v for _, v in read(broker, sink, "read_committed", 5)] == [
        b"out-%d" % i for i in range(5)
    ]


@pytest.mark.parametrize("client", ["aiokafka", "kafka-python"])
def test_other_clients_commit_and_abort(broker: BrokerProcess, client: str) -> None:
    """aiokafka sends every transaction API at v0 and kafka-python at up to v3: both see
    the same outcome as librdkafka."""
    topic = topic_of(broker)
    if client == "aiokafka":
        asyncio.run(_aiokafka_transactions(broker.bootstrap, topic))
    else:
        _kafka_python_transactions(broker.bootstrap, topic)
    assert [v for _, v in read(broker, topic, "read_committed", 2)] == [b"kept-0", b"kept-1"]
    assert len(read(broker, topic, "read_uncommitted", 3)) == 3


async def _aiokafka_transactions(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{topic}")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"kept-0")
        with contextlib.suppress(RuntimeError):
            async with producer.transaction():
                await producer.send_and_wait(topic, b"dropped")
                raise RuntimeError("abort")
        async with producer.transaction():
            await producer.send_and_wait(topic, b"kept-1")
    finally:
        await producer.stop()


def _kafka_python_transactions(bootstrap: str, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{topic}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"kept-0")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(topic, b"dropped").get(TIMEOUT_S)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"kept-1")
        producer.commit_transaction()
    finally:
        producer.close()


async def _tiered_read_committed(
    bootstrap: str, storage: str, topic: str
) -> list[tuple[int, bytes | None]]:
    """A bounded read of the remote tier only, read committed, by the broker-free reader."""
    consumer = TieredConsumer(
        mode="REMOTE_ONLY",
        storage=storage,
        bounded=True,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign([AioTopicPartition(topic, 0)])
        return [(r.offset, r.value) async for r in consumer]
    finally:
        await consumer.stop()


def test_read_committed_of_the_remote_tier_leaves_out_aborted_transactions(
    broker: BrokerProcess,
) -> None:
    started = start_transactional_topic(broker, f"txn-tiered-{uuid.uuid4().hex[:8]}")
    topic = started.done
    # An open transaction: nothing from its first offset on is copied.
    assert status(broker, topic.name)["remote_log_end_offset"] < topic.open_at
    committed = [v for _, v in read(broker, topic.name, "read_committed", len(topic.committed))]
    assert committed == topic.committed
    started.producer.abort_transaction(TIMEOUT_S)
    wait_for(
        lambda: status(broker, topic.name)["remote_log_end_offset"] >= topic.open_at,
        "the copy past the aborted transaction",
        show=lambda: status(broker, topic.name),
    )
    # From the object store alone: the same committed records, and none from the
    # transaction that was open when its segment rolled (its marker is local only).
    remote = asyncio.run(_tiered_read_committed(broker.bootstrap, topic.storage, topic.name))
    assert [v for _, v in remote] == topic.committed
    assert max(offset for offset, _ in remote) < topic.open_at


# Bad input, on the wire ----------------------------------------------------------------


def _init(client: WireClient, transactional_id: str) -> tuple[int, int]:
    """FindCoordinator (which creates `__transaction_state`), then InitProducerId."""
    find = request_module(10, 3)
    client.request(make(find.FindCoordinatorRequest, key=transactional_id, key_type=1))
    m = request_module(22, 4)
    deadline = time.monotonic() + TIMEOUT_S
    while True:  # the coordinator loads its partition first
        answer = client.request(
            make(
                m.InitProducerIdRequest,
                transactional_id=transactional_id,
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        if answer.error_code == ErrorCode.none or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert answer.error_code == ErrorCode.none, answer
    return int(answer.producer_id), int(answer.producer_epoch)


def _txn_produce(
    client: WireClient,
    transactional_id: str,
    topic: str,
    pid: int,
    epoch: int,
    seq: int,
    version: int = 9,
) -> ErrorCode:
    m = request_module(0, version)
    batch = build_batch(
        [(None, b"v%d" % seq, (), int(time.time() * 1000))],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=True,
    )
    response = client.request(
        m.ProduceRequest(
            transactional_id=transactional_id,
            acks=-1,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(
                m.TopicProduceData(
                    name=topic, partition_data=(m.PartitionProduceData(index=0, records=batch),)
                ),
            ),
        )
    )
    return ErrorCode(response.responses[0].partition_responses[0].error_code)


def _add_partition(
    client: WireClient, transactional_id: str, topic: str, pid: int, epoch: int, version: int = 3
) -> ErrorCode:
    m = request_module(24, version)
    response = client.request(
        m.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=(m.AddPartitionsToTxnTopic(name=topic, partitions=(0,)),),
        )
    )
    return ErrorCode(
        response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
    )


def _end_txn(
    client: WireClient, transactional_id: str, pid: int, epoch: int, commit: bool, version: int
) -> Any:
    m = request_module(26, version)
    return client.request(
        m.EndTxnRequest(
            transactional_id=transactional_id,
            producer_id=pid,
            producer_epoch=epoch,
            committed=commit,
        )
    )


def _end(
    client: WireClient, transactional_id: str, pid: int, epoch: int, commit: bool
) -> ErrorCode:
    return ErrorCode(_end_txn(client, transactional_id, pid, epoch, commit, 3).error_code)


def test_what_a_transaction_does_not_allow_is_refused_and_not_written(
    broker: BrokerProcess,
) -> None:
    topic = topic_of(broker)
    transactional_id = f"tx-{topic}"
    with WireClient(broker.port) as client:
        pid, epoch = _init(client, transactional_id)
        # No AddPartitionsToTxn: the coordinator does not confirm it (KIP-890 part 1).
        assert _txn_produce(client, transactional_id, topic, pid, epoch, 0) == (
            ErrorCode.invalid_txn_state
        )
        assert _end(client, transactional_id, pid, epoch, True) == ErrorCode.invalid_txn_state
        assert _add_partition(client, transactional_id, topic, pid, epoch) == ErrorCode.none
        assert _txn_produce(client, transactional_id, topic, pid, epoch, 0) == ErrorCode.none
        assert _end(client, transactional_id, pid, epoch, True) == ErrorCode.none
        # The next transaction waits for the markers; then, after its commit, a produce
        # without AddPartitionsToTxn is refused again.
        wait_for(
            lambda: _add_partition(client, transactional_id, topic, pid, epoch) == ErrorCode.none,
            "the commit's markers",
        )
        assert _end(client, transactional_id, pid, epoch, False) == ErrorCode.none
        wait_for(
            lambda: _end(client, transactional_id, pid, epoch, False) == ErrorCode.none,
            "the abort to complete",
        )
        assert _txn_produce(client, transactional_id, topic, pid, epoch, 1) == (
            ErrorCode.invalid_txn_state
        )
        # A new instance fences this one: its requests are an old epoch's.
        assert _init(client, transactional_id) == (pid, epoch + 1)
        assert _add_partition(client, transactional_id, topic, pid, epoch) == (
            ErrorCode.producer_fenced
        )
        assert _add_partition(client, transactional_id, topic, pid, epoch, version=1) == (
            ErrorCode.invalid_producer_epoch  # what a version without PRODUCER_FENCED is told
        )
        assert _txn_produce(client, transactional_id, topic, pid, epoch, 2) == (
            ErrorCode.invalid_producer_epoch
        )
    assert [v for _, v in read(broker, topic, "read_uncommitted", 1)] == [b"v0"]
    assert "transactional produce of" in broker.log()


def _end_v2(
    client: WireClient, transactional_id: str, pid: int, epoch: int, commit: bool
) -> tuple[ErrorCode, int, int]:
    """EndTxn v5 (transactions v2): its error and the producer id and epoch it answers."""
    response = _end_txn(client, transactional_id, pid, epoch, commit, 5)
    return ErrorCode(response.error_code), response.producer_id, response.producer_epoch


def test_transactions_v2_add_partitions_with_the_first_batch_and_end_at_the_next_epoch(
    broker: BrokerProcess,
) -> None:
    """KIP-890 part 2 on the wire: Produce v12 adds the partition to the transaction, which
    EndTxn v5 ends at the next epoch; a retry is known by its epoch; an abort needs no
    open transaction; the old epoch is fenced. Produce v11 knows TRANSACTION_ABORTABLE."""
    topic = topic_of(broker)
    transactional_id = f"tx-{topic}"
    with WireClient(broker.port) as client:
        pid, epoch = _init(client, transactional_id)
        assert _txn_produce(client, transactional_id, topic, pid, epoch, 0, 12) == ErrorCode.none
        committed = (ErrorCode.none, pid, epoch + 1)
        assert _end_v2(client, transactional_id, pid, epoch, True) == committed
        wait_for(  # the retry: CONCURRENT_TRANSACTIONS while the markers are written
            lambda: _end_v2(client, transactional_id, pid, epoch, True) == committed,
            "the commit to complete",
        )
        assert _txn_produce(client, transactional_id, topic, pid, epoch, 1, 12) == (
            ErrorCode.invalid_producer_epoch
        )
        assert _end_v2(client, transactional_id, pid, epoch + 1, False) == (
            ErrorCode.none,
            pid,
            epoch + 2,
        )  # nothing was sent: an abort all the same
        wait_for(
            lambda: (
                _end_v2(client, transactional_id, pid, epoch + 2, True)[0]
                == ErrorCode.invalid_txn_state
            ),
            "the empty abort to complete",
        )
        assert _txn_produce(client, transactional_id, topic, pid, epoch + 2, 0, 12) == (
            ErrorCode.none
        )
        assert _end_v2(client, transactional_id, pid, epoch + 2, False)[0] == ErrorCode.none
        other = f"{transactional_id}-v11"
        other_pid, other_epoch = _init(client, other)
        assert _txn_produce(client, other, topic, other_pid, other_epoch, 0, 11) == (
            ErrorCode.transaction_abortable
        )
    assert [v for _, v in read(broker, topic, "read_committed", 1)] == [b"v0"]
    assert [v for _, v in read(broker, topic, "read_uncommitted", 2)] == [b"v0", b"v0"]


def test_kafka_transactions_tool_lists_and_describes_them(kafka_broker: str) -> None:
    """`kafka-transactions.sh list` and `describe` (DescribeTransactions, ListTransactions)
    say the same of an open, then committed, transaction on both brokers."""
    topic = f"txn-tool-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    transactional_id = f"tx-{topic}"
    p = Producer({"bootstrap.servers": kafka_broker, "transactional.id": transactional_id})
    p.init_transactions(TIMEOUT_S)
    p.begin_transaction()
    p.produce(topic, b"open")
    p.flush(TIMEOUT_S)

    def row(*args: str) -> dict[str, str]:
        lines = run_tool("TransactionsCommand", "--bootstrap-server", kafka_broker, *args)
        header, *rows = [line.split() for line in lines.splitlines() if line.strip()]
        [found] = [r for r in rows if transactional_id in r]
        return dict(zip(header, found, strict=False))

    listed = row("list")
    assert listed["TransactionState"] == "Ongoing"
    described = row("describe", "--transactional-id", transactional_id)
    assert described["TransactionState"] == "Ongoing"
    assert described["ProducerEpoch"] == "0"
    assert described["TopicPartitions"] == f"{topic}-0"
    p.commit_transaction(TIMEOUT_S)
    wait_for(
        lambda: (
            row("describe", "--transactional-id", transactional_id)["TransactionState"]
            == "CompleteCommit"
        ),
        "the commit to complete",
    )


def test_kafka_transactions_tool_aborts_a_hanging_transaction(kafka_broker: str) -> None:
    """`kafka-transactions.sh describe-producers` finds where an open transaction starts
    (DescribeProducers) and `abort --start-offset` ends it (WriteTxnMarkers from the
    admin client): read_committed consumers then read past it, on both brokers."""
    topic = f"txn-hang-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    p = Producer({"bootstrap.servers": kafka_broker, "transactional.id": f"tx-{topic}"})
    p.init_transactions(TIMEOUT_S)
    p.begin_transaction()
    p.produce(topic, b"hanging")
    p.flush(TIMEOUT_S)

    def producers() -> list[dict[str, str]]:
        lines = run_tool(
            "TransactionsCommand",
            "--bootstrap-server",
            kafka_broker,
            "describe-producers",
            "--topic",
            topic,
            "--partition",
            "0",
        )
        header, *rows = [line.split() for line in lines.splitlines() if line.strip()]
        return [dict(zip(header, row, strict=True)) for row in rows]

    [open_] = producers()
    assert open_["CurrentTransactionStartOffset"] == "0"
    run_tool(
        "TransactionsCommand",
        "--bootstrap-server",
        kafka_broker,
        "abort",
        "--topic",
        topic,
        "--partition",
        "0",
        "--start-offset",
        "0",
    )
    [aborted] = producers()
    assert aborted["CurrentTransactionStartOffset"] == "None"
    consumer = Consumer(
        {"bootstrap.servers": kafka_broker, "group.id": topic, "isolation.level": "read_committed"}
    )
    try:  # the record and the abort marker, now stable
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), TIMEOUT_S) == (0, 2)
    finally:
        consumer.close()
