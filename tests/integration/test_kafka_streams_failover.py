"""Kafka Streams' word count (tests/java/WordCount.java, `serve`) with exactly_once_v2 on
three tierbroker brokers, across broker crashes.

Every topic has three replicas and min.insync.replicas=2: the input and output the test
creates, and the changelog and repartition topics Streams creates. While lines are fed
to the input, the leader of the count store's changelog partition is killed (a crash:
nothing flushed, no controlled shutdown) and restarted, then the coordinator of the
Streams producer's transactional id, each once the output shows progress. The count
forwards every update (no cache), so the output holds each word's counts 1, 2, ..., N
in turn: read committed, the final counts are exact and no step of a count is missing
or there twice (a transaction a crash aborts must leave none of its records, and its
input be counted again exactly once).
"""

from __future__ import annotations

import re
import struct
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.apache_kafka import java_command, run_tool
from tests.integration.kafka_tools import describe_transaction, unique
from tests.integration.test_kafka_streams import lines
from tests.integration.test_verifiable_clients import transactions
from tests.integration.waiting import wait_for
from tierbroker.broker.coordinator.group.records import partition_for
from tierbroker.testing import cluster_fixture
from tierbroker.testing.cluster import TEST_SETTINGS, TierbrokerCluster

pytestmark = pytest.mark.slow

TIMEOUT_S = 180.0
PARTITIONS = 2
LINES = lines() * 2
LINES_PER_S = 30
TRANSACTION_PARTITIONS = int(TEST_SETTINGS["transaction.state.log.num.partitions"])

cluster = cluster_fixture("module", brokers=3, broker_config={"replica.lag.time.max.ms": 3000})


def expected_counts() -> Counter[str]:
    words = (w for line in LINES for w in re.split(r"\W+", line.lower(), flags=re.ASCII))
    return Counter(w for w in words if w)


class WordCount:
    """WordCount.java serving: counting until its standard input closes."""

    def __init__(self, directory: Path, bootstrap: str, source: str, sink: str) -> None:
        self.out = directory / "wordcount.out"
        self.err = directory / "wordcount.err"
        command = java_command(
            "WordCount.java",
            *("serve", bootstrap, source, sink, str(directory / "state"), "exactly_once_v2", "3"),
        )
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err)

    def printed(self, prefix: str) -> list[str]:
        return [line for line in self.out.read_text().splitlines() if line.startswith(prefix)]

    def running(self) -> bool:
        """Whether Streams is RUNNING now; fails if it hit an error or exited."""
        if self.printed("error ") or self.process.poll() is not None:
            raise AssertionError(f"word count failed:\n{self.log()}")
        states = self.printed("state ")
        return bool(states) and states[-1] == "state RUNNING"

    def close(self, timeout_s: float = TIMEOUT_S) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        code = self.process.wait(timeout_s)
        assert code == 0 and self.printed("closed"), f"exited {code}:\n{self.log()}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        return f"{self.out.read_text()[-3000:]}\n{self.err.read_text()[-3000:]}"


class Feeder(threading.Thread):
    """Sends LINES to the input, LINES_PER_S a second, idempotent with acks=all."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 0}
        )
        self.topic = topic
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        for line in LINES:
            if self.stop.wait(1 / LINES_PER_S):
                return
            self.producer.produce(self.topic, line.encode())
            self.producer.poll(0)
            self.sent += 1

    def flush(self) -> None:
        self.join(TIMEOUT_S)
        assert self.producer.flush(TIMEOUT_S) == 0, "lines left unacknowledged"


class Output:
    """The output topic read committed from its start: each word's counts in the order
    written."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("output-reader"),
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "log_level": 0,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.counts: dict[str, list[int]] = {}
        self.at_end: set[int] = set()

    def poll(self) -> None:
        for message in self.consumer.consume(1000, 0.2):
            error, key, value = message.error(), message.key(), message.value()
            if error is None:
                assert key is not None and value is not None, "a count without word or value"
                (count,) = struct.unpack(">q", value)
                self.counts.setdefault(key.decode(), []).append(count)
            elif error.code() == KafkaError._PARTITION_EOF:
                self.at_end.add(int(message.partition() or 0))

    def counted(self) -> int:
        """Words counted so far: the sum of each word's latest count."""
        self.poll()
        return sum(steps[-1] for steps in self.counts.values())

    def read_to_end(self) -> dict[str, list[int]]:
        """Each word's counts, once every partition was read to its end (the first time)."""

        def at_end() -> bool:
            self.poll()
            return self.at_end == set(range(PARTITIONS))

        wait_for(at_end, "the output read to its end", TIMEOUT_S)
        return self.counts

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture
def running() -> Iterator[list[WordCount | Feeder | Output]]:
    """What a test starts (it appends them), stopped when it ends."""
    started: list[WordCount | Feeder | Output] = []
    yield started
    for thing in started:
        if isinstance(thing, WordCount):
            thing.kill()
        elif isinstance(thing, Feeder):
            thing.stop.set()
        else:
            thing.close()


def all_in_sync(cluster: TierbrokerCluster) -> bool:
    """Every partition of every topic has its three replicas in its ISR."""

    def read() -> bool:
        server = next(b for b in cluster.embedded.brokers if b.running)
        return all(len(state.isr) == 3 for state in server.cache.states.values())

    return bool(cluster.embedded.read(read))


def transactional_ids(bootstrap: str) -> list[str]:
    """The transactional ids the brokers know, as `kafka-transactions.sh list` prints."""
    listed = run_tool("TransactionsCommand", "--bootstrap-server", bootstrap, "list")
    header, *rows = [line.split() for line in listed.splitlines() if line.strip()]
    return [dict(zip(header, row, strict=False))["TransactionalId"] for row in rows]


def test_exactly_once_word_count_is_exact_across_changelog_leader_and_coordinator_kills(
    cluster: TierbrokerCluster, tmp_path: Path, running: list[WordCount | Feeder | Output]
) -> None:
    source = unique("words")
    sink = f"{source}-counts"
    for topic in (source, sink):
        cluster.create_topic(topic, PARTITIONS, 3, config={"min.insync.replicas": 2})
    changelog = f"{source}-wordcount-counts-changelog"
    expected = expected_counts()
    total = sum(expected.values())

    app = WordCount(tmp_path, cluster.bootstrap_servers, source, sink)
    running.append(app)
    wait_for(app.running, "Streams RUNNING", TIMEOUT_S, show=app.log)
    output = Output(cluster.bootstrap_servers, sink)
    running.append(output)
    feeder = Feeder(cluster.bootstrap_servers, source)
    running.append(feeder)
    feeder.start()

    wait_for(lambda: output.counted() > 0, "a first count", TIMEOUT_S)
    (streams_id,) = transactional_ids(cluster.bootstrap_servers)
    wait_for(lambda: output.counted() >= total // 4, "a quarter counted", TIMEOUT_S)
    changelog_leader = cluster.leader(changelog, 0)
    cluster.kill_broker(changelog_leader)
    cluster.start_broker(changelog_leader)

    wait_for(lambda: all_in_sync(cluster), "every replica back in its ISR", TIMEOUT_S)
    wait_for(lambda: output.counted() >= total // 2, "half counted", TIMEOUT_S)
    state_partition = partition_for(streams_id, TRANSACTION_PARTITIONS)
    coordinator = cluster.leader("__transaction_state", state_partition)
    cluster.kill_broker(coordinator)
    cluster.start_broker(coordinator)

    feeder.flush()
    wait_for(
        lambda: app.running() and output.counted() >= total,
        "every word counted",
        TIMEOUT_S,
        show=lambda: (
            f"{output.counted()} of {total} words counted, {feeder.sent} lines sent; "
            f"its transaction:\n{describe_transaction(cluster.bootstrap_servers, streams_id)}"
        ),
    )
    app.close()
    # Once no transaction of Streams is left open, a new reader sees all it committed.
    wait_for(
        lambda: all(transactions(cluster, sink, p).open == {} for p in range(PARTITIONS)),
        "every transaction of Streams ended",
        TIMEOUT_S,
    )
    checker = Output(cluster.bootstrap_servers, sink)
    running.append(checker)
    counts = checker.read_to_end()
    assert {word: steps[-1] for word, steps in counts.items()} == expected
    wrong = {
        word: steps for word, steps in counts.items() if steps != list(range(1, expected[word] + 1))
    }
    assert not wrong, (
        f"counts with a step missing or repeated (changelog leader {changelog_leader} "
        f"killed, then coordinator {coordinator}): {wrong}"
    )
