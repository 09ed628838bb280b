"""Transactions through kafkajs, the Node.js client (tests/js/transactions.js), on one
broker and on three with a topic of three replicas.

kafkajs speaks older versions of the transaction APIs than the Java client and
librdkafka (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and
EndTxn v0-v1, Produce up to v7, Fetch up to v11) and knows no PRODUCER_FENCED, so a
fenced producer must be told INVALID_PRODUCER_EPOCH. The program commits one
transaction and aborts one, sends a consumer group's offsets in consume-transform-produce
transactions, and is fenced by a second producer with its transactional id; its
read_committed consumer must see exactly the committed records and its read_uncommitted
one every record written. confluent-kafka checks the same topic and group.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tierbroker.testing import TierbrokerCluster

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "js" / "transactions.js"
PEER = ROOT / "peers" / "kafkajs"
INSTALL = "`make install-test` or `scripts/install-peers.sh` installs it"
TIMEOUT_S = 90.0

INPUT = [f"in{i}" for i in range(4)]
COMMITTED = ["c0", "c1", "c2", "c3", "c4"]
ABORTED = ["a0", "a1", "a2"]
TRANSFORMED = [f"out-{v}" for v in INPUT]
# (offset, value) of the topic's records: each transaction's records, then its marker;
# "zombie" is aborted when the second producer fences the first.
READ_COMMITTED = list(
    zip([0, 1, 2, 3, 4, 10, 12, 14, 16, 20], [*COMMITTED, *TRANSFORMED, "successor"], strict=True)
)
READ_UNCOMMITTED = list(
    zip(
        [0, 1, 2, 3, 4, 6, 7, 8, 10, 12, 14, 16, 18, 20],
        [*COMMITTED, *ABORTED, *TRANSFORMED, "zombie", "successor"],
        strict=True,
    )
)
FENCED = {"type": "INVALID_PRODUCER_EPOCH", "code": 47}


def pinned_kafkajs() -> str:
    return str(json.loads((PEER / "package.json").read_text())["dependencies"]["kafkajs"])


def node() -> str:
    """The node command, with the pinned kafkajs installed; a failure says how to get them."""
    found = shutil.which("node")
    if found is None:
        pytest.fail(f"node is missing: {INSTALL} (Debian's nodejs and npm)", pytrace=False)
    pinned = pinned_kafkajs()
    installed = PEER / "node_modules" / "kafkajs" / "package.json"
    version = json.loads(installed.read_text())["version"] if installed.exists() else None
    if version != pinned:
        pytest.fail(
            f"kafkajs {pinned} is not installed in peers/kafkajs (found: {version}): "
            f"{INSTALL} (npm ci --prefix peers/kafkajs)",
            pytrace=False,
        )
    return found


def create_topics(cluster: TierbrokerCluster, names: list[str], replicas: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    config = {"min.insync.replicas": "2"} if replicas > 1 else {}
    futures = admin.create_topics([NewTopic(n, 1, replicas, config=config) for n in names])
    for future in futures.values():
        future.result(TIMEOUT_S)
    for name in names:
        cluster.wait_for(
            lambda name=name: cluster.leader(name) >= 0 and len(cluster.isr(name)) == replicas,
            f"every replica of {name} in its ISR",
        )


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value.encode(), partition=0)
    assert producer.flush(TIMEOUT_S) == 0


def read_committed(bootstrap: str, topic: str, last: str) -> list[tuple[int, str]]:
    """(offset, value) of TOPIC's records read committed by librdkafka, up to `last`."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[int, str]] = []
    try:
        while not got or got[-1][1] != last:
            message = consumer.poll(TIMEOUT_S)
            assert message is not None, f"no record after {got}"
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(message.error())
            got.append((message.offset(), message.value().decode()))
    finally:
        consumer.close()
    return got


def run_program(*args: str) -> dict[str, Any]:
    command = [node(), str(PROGRAM), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (
        f"transactions.js exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def fencing(error: dict[str, Any] | None) -> dict[str, Any] | None:
    """The protocol error a kafkajs error is, or was caused by."""
    while error is not None and error.get("type") is None:
        error = error.get("cause")
    return None if error is None else {"type": error["type"], "code": error["code"]}


@pytest.mark.parametrize(
    ("fixture", "replicas"), [("shared_tierbroker", 1), ("shared_tierbroker_cluster", 3)]
)
def test_kafkajs_transactions_commit_abort_send_offsets_and_fence(
    request: pytest.FixtureRequest, fixture: str, replicas: int
) -> None:
    node()
    cluster: TierbrokerCluster = request.getfixturevalue(fixture)
    bootstrap = cluster.bootstrap_servers
    name = f"kafkajs-{uuid.uuid4().hex[:8]}"
    topic, source, group = f"{name}-out", f"{name}-in", f"{name}-group"
    create_topics(cluster, [topic, source], replicas)
    produce(bootstrap, source, INPUT)

    result = run_program(bootstrap, topic, source, str(len(INPUT)), group, f"{name}-tx")

    assert result["kafkajs_version"] == pinned_kafkajs()
    assert result["transform"] == {
        "offsets": ["0", "1", "2", "3"],
        "pending_offset": "3",  # the last transaction's offset counts once it commits
        "committed_offset": "4",
    }
    assert fencing(result["fenced_send"]) == FENCED, result["fenced_send"]
    assert fencing(result["fenced_commit"]) == FENCED, result["fenced_commit"]
    assert result["successor_commit"] is None

    assert [(r["offset"], r["value"]) for r in result["read_committed"]] == READ_COMMITTED
    assert [(r["offset"], r["value"]) for r in result["read_uncommitted"]] == READ_UNCOMMITTED

    assert read_committed(bootstrap, topic, "successor") == READ_COMMITTED
    assert cluster.committed(group, TIMEOUT_S) == {(source, 0): len(INPUT)}
