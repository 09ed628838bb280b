"""Exactly-once with Kafka's own system-test clients across a leader's crash, on three
tierbroker brokers (topics with three replicas, min.insync.replicas=2).

Kafka 4.3's VerifiableProducer has no transactional mode (it never calls
initTransactions, which a producer with a transactional.id must call before it sends),
so this runs what Kafka's exactly-once system test
(tests/kafkatest/tests/core/transactions_test.py) runs: VerifiableProducer, idempotent
with acks=all, seeds an input topic; TransactionalMessageCopier copies it to an output
topic in transactions that also commit the consumed offsets (`--use-group-metadata`),
aborting about a third of them on purpose (`--enable-random-aborts`) and rewinding to
the committed offset after each abort; VerifiableConsumer reads the output with
isolation.level=read_committed (set in its `--command-config`, as it has no option for
it) while it is written. The input's leader is killed (a crash: nothing flushed, no
controlled shutdown) while the producer seeds it, the output's while the copier
copies, each after the tools' JSON events show progress, and restarted.

From the tools' JSON events: every value the producer had acknowledged is read by the
consumer exactly once, in order, and none of the offsets it read lies in an aborted
transaction. Which transactions were aborted is read from the output's own batches
(fetched uncommitted, markers included), not from the broker's read_committed answer:
a transactional batch belongs to the transaction that its producer's next marker ends.
"""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.apache_kafka import tool_command
from tests.integration.kafka_tools import describe_transaction, unique, write
from tests.integration.waiting import wait_for
from tests.integration.wire import WireClient, fetch_request, split_batches
from tierbroker.broker.coordinator.group.records import partition_for
from tierbroker.testing import cluster_fixture
from tierbroker.testing.cluster import TEST_SETTINGS, TierbrokerCluster

pytestmark = pytest.mark.slow

RECORDS = 4000
TRANSACTION_SIZE = 50
TIMEOUT_S = 120.0
TRANSACTION_PARTITIONS = int(TEST_SETTINGS["transaction.state.log.num.partitions"])

cluster = cluster_fixture("module", brokers=3, broker_config={"replica.lag.time.max.ms": 3000})


class Tool:
    """One of Kafka's tools running in the background, its JSON lines in a file."""

    def __init__(self, directory: Path, tool: str, *args: str) -> None:
        self.name = tool
        self.out = directory / f"{tool}.jsonl"
        self.err = directory / f"{tool}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(tool_command(tool, *args), stdout=out, stderr=err)

    def events(self) -> list[dict[str, Any]]:
        """The JSON objects printed so far (the last line may be half written yet)."""
        lines = self.out.read_text().split("\n")[:-1]
        return [json.loads(line) for line in lines if line.startswith("{")]

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("name") == name]

    def alive(self) -> bool:
        if self.process.poll() is None:
            return True
        raise AssertionError(
            f"{self.name} exited {self.process.returncode}:\n{self.err.read_text()[-3000:]}"
        )

    def wait(self, timeout_s: float = TIMEOUT_S) -> None:
        """Wait for it to exit by itself; fail unless it exits 0."""
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout_s:g}s") from None
        assert code == 0, f"{self.name} exited {code}:\n{self.err.read_text()[-3000:]}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def tools() -> Iterator[list[Tool]]:
    """The tools a test starts (it appends them), killed when it ends."""
    started: list[Tool] = []
    yield started
    for tool in started:
        tool.stop()


@dataclass
class Transactions:
    """A partition's data offsets by the outcome of their transactions."""

    committed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    open: dict[int, list[int]] = field(default_factory=dict)  # by producer id
    end: int = 0  # the offset after the last batch


# Record batch v2: base offset, length, leader epoch, magic, crc, attributes, last offset
# delta, first and max timestamps, producer id and epoch, base sequence, record count.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
TRANSACTIONAL, CONTROL = 0x10, 0x20
ABORT, COMMIT = 0, 1


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """A zigzag varint at `position`: (value, position after it)."""
    shift = value = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), position


def _control_type(batch: bytes) -> int:
    """The type of a control batch's marker: its record key is (version, type)."""
    position = BATCH_HEADER.size
    _length, position = _varint(batch, position)
    position += 1  # attributes
    _timestamp_delta, position = _varint(batch, position)
    _offset_delta, position = _varint(batch, position)
    key_length, position = _varint(batch, position)
    assert key_length == 4, f"control record key of {key_length} bytes"
    _version, kind = struct.unpack_from(">hh", batch, position)
    return int(kind)


def transactions(cluster: TierbrokerCluster, topic: str, partition: int = 0) -> Transactions:
    """The partition's batches read uncommitted from its leader, up to its high
    watermark, sorted by the markers that end their transactions."""
    host, port = cluster.address(cluster.leader(topic, partition)).rsplit(":", 1)
    found = Transactions()
    with WireClient(int(port), host) as client:
        while True:
            response = client.request(fetch_request(12, [(topic, [(partition, found.end)])]))
            (answer,) = response.responses[0].partitions
            assert answer.error_code == 0, answer
            batches, _partial = split_batches(answer.records)
            for batch in batches:
                base, _, _, magic, _, attributes, last_delta, _, _, pid, *_ = (
                    BATCH_HEADER.unpack_from(batch)
                )
                assert magic == 2
                offsets = list(range(base, base + last_delta + 1))
                if attributes & CONTROL:
                    outcome = {ABORT: found.aborted, COMMIT: found.committed}[_control_type(batch)]
                    outcome += found.open.pop(pid, [])
                elif attributes & TRANSACTIONAL:
                    found.open.setdefault(pid, []).extend(offsets)
                else:
                    found.committed += offsets
                found.end = base + last_delta + 1
            if found.end >= answer.high_watermark or not batches:
                return found


def wait_in_sync(cluster: TierbrokerCluster, partitions: list[tuple[str, int]]) -> None:
    cluster.wait_for(
        lambda: all(len(cluster.isr(t, p)) == 3 for t, p in partitions),
        f"every replica of {partitions} in its ISR",
        TIMEOUT_S,
    )


def test_read_committed_consumer_reads_every_acked_record_once_across_leader_kills(
    cluster: TierbrokerCluster, tmp_path: Path, tools: list[Tool]
) -> None:
    source, copy = unique("eos-input"), unique("eos-output")
    transactional_id = unique("copier")
    for topic in (source, copy):
        cluster.create_topic(topic, 1, 3, config={"min.insync.replicas": 2})
    bootstrap = ("--bootstrap-server", cluster.bootstrap_servers)

    # Seeding: idempotent, retrying until acknowledged, as the system test's seed producer.
    idempotent = "enable.idempotence=true\nacks=all\nretries=2147483647\n"
    producer = Tool(
        tmp_path,
        "VerifiableProducer",
        *bootstrap,
        *("--topic", source, "--max-messages", str(RECORDS), "--throughput", "1000"),
        *("--command-config", write(tmp_path / "producer.properties", idempotent)),
    )
    tools.append(producer)
    wait_for(
        lambda: producer.alive() and len(producer.named("producer_send_success")) >= RECORDS // 4,
        "a quarter of the records acknowledged",
        TIMEOUT_S,
    )
    victim = cluster.leader(source)
    cluster.kill_broker(victim)
    cluster.start_broker(victim)
    producer.wait()
    assert producer.named("producer_send_error") == []
    acked = producer.named("producer_send_success")
    assert sorted(int(e["value"]) for e in acked) == list(range(RECORDS))
    assert len({e["offset"] for e in acked}) == RECORDS  # nothing written twice

    wait_in_sync(cluster, [(source, 0), (copy, 0)])
    read_committed = write(tmp_path / "consumer.properties", "isolation.level=read_committed\n")
    consumer = Tool(
        tmp_path,
        "VerifiableConsumer",
        *bootstrap,
        *("--topic", copy, "--group-id", f"{copy}-reader", "--verbose"),
        *("--command-config", read_committed),
    )
    tools.append(consumer)
    copier = Tool(
        tmp_path,
        "TransactionalMessageCopier",
        *("--broker-list", cluster.bootstrap_servers, "--transactional-id", transactional_id),
        *("--input-topic", source, "--input-partition", "0", "--output-topic", copy),
        *("--consumer-group", f"{copy}-copier", "--transaction-size", str(TRANSACTION_SIZE)),
        *("--enable-random-aborts", "--use-group-metadata"),
    )
    tools.append(copier)

    def copied() -> int:
        loops = [e for e in copier.events() if e.get("stage") == "ProcessLoop"]
        return int(loops[-1]["totalProcessed"]) if loops else 0

    def progress() -> str:
        described = describe_transaction(cluster.bootstrap_servers, transactional_id)
        return f"{copied()} copied; its transaction:\n{described}"

    wait_for(
        lambda: copier.alive() and copied() >= RECORDS // 4,
        "a quarter of the records copied",
        TIMEOUT_S,
        show=progress,
    )
    victim = cluster.leader(copy)
    state_partition = partition_for(transactional_id, TRANSACTION_PARTITIONS)
    coordinator = cluster.leader("__transaction_state", state_partition)
    cluster.kill_broker(victim)
    cluster.start_broker(victim)
    wait_for(
        lambda: copier.process.poll() is not None,
        "the copier to copy every record",
        TIMEOUT_S,
        show=progress,
    )
    copier.wait()
    (done,) = [e for e in copier.events() if e.get("stage") == "ShutdownComplete"]
    assert (done["totalProcessed"], done["remaining"]) == (RECORDS, 0)

    def ended() -> Transactions | None:
        """The output's transactions once all ended (their markers written)."""
        found = transactions(cluster, copy)
        return found if not found.open else None

    log = wait_for(ended, "every transaction of the copier ended", TIMEOUT_S)

    def read() -> list[dict[str, Any]]:
        return consumer.named("record_data")

    wait_for(
        lambda: consumer.alive() and log.committed[-1] in {e["offset"] for e in read()},
        "the consumer to read the last committed record",
        TIMEOUT_S,
        show=lambda: (len(read()), read()[-1:], log.committed[-1]),
    )
    consumed = read()
    offsets = [e["offset"] for e in consumed]
    assert log.aborted, "no transaction aborted: the copier's random aborts did not run"
    assert not set(offsets) & set(log.aborted), "records of aborted transactions read"
    assert [int(e["value"]) for e in consumed] == list(range(RECORDS)), (
        f"{len(consumed)} read, {len(set(offsets))} offsets; "
        f"leader {victim} killed, coordinator {coordinator}"
    )
    assert offsets == log.committed
