"""A Quix Streams application with `processing_guarantee="exactly-once"` on a three-broker
tierbroker cluster: it counts the records of each key (word) in its RocksDB store, which
Quix logs to a compacted changelog topic it creates through the Admin API (sized and
configured from what DescribeConfigs says of the input topic), and writes every running
count to an output topic, all in one transaction per checkpoint (KIP-447 offsets).

Exactly once means the output, read committed, holds each count step 1..n of a word once
and in order, n being the number of input records with that word: a duplicate or lost
step, or a count restarted from zero, shows. It must hold while brokers die mid-transaction
(the transaction coordinator, the leader of an input partition, the coordinator again:
each killed, no controlled shutdown, when an open transaction of the app's is seen on the
output, then restarted), when the app itself is killed mid-transaction and started again
(its successor's InitProducerId aborts what it left open), and across a restart of the
app on an emptied state directory, whose store Quix then restores from the changelog
before counting on.

The app (tests/integration/quix_count_app.py) runs in a process of its own: Quix's
`Application.run()` blocks and handles SIGTERM, which stops it after a last commit. Its
interpreter is the virtualenv scripts/install-peers.sh makes for Quix Streams, which pins
an older confluent-kafka than the rest of the suite uses.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from tests.integration.test_transactions_cluster import isr, leader
from tests.integration.waiting import wait_for
from tierbroker.broker.coordinator.group.records import partition_for
from tierbroker.broker.server.embedded import EmbeddedCluster

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("quix_count_app.py")
QUIX_VENV = Path(__file__).parents[2] / "peers" / "quixstreams" / ".venv"
VOCABULARY = "the quick brown fox jumps over lazy dog tiered log segment broker".split()
INPUT_PARTITIONS = 2
COORDINATOR_PARTITIONS = 3
TIMEOUT_S = 120.0


def require_quixstreams() -> None:
    if not (QUIX_VENV / ".installed").exists():
        pytest.fail(
            "Quix Streams is missing: `make install-test` (scripts/install-peers.sh) "
            "installs it in peers/quixstreams/.venv",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(
        tmp_path_factory.mktemp("quix") / "brokers",
        brokers=3,
        properties={
            "replica.lag.time.max.ms": "3000",
            "zookeeper.session.timeout.ms": "3000",
            "metrics.port": "-1",
            "group.initial.rebalance.delay.ms": "0",
            "offsets.topic.num.partitions": str(COORDINATOR_PARTITIONS),
            "transaction.state.log.num.partitions": str(COORDINATOR_PARTITIONS),
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
            # the changelog Quix creates gets the broker's default
            "min.insync.replicas": "2",
        },
    ) as running:
        yield running


class Pipeline:
    """The topics, names and clients of one run of the count app on the cluster."""

    def __init__(self, cluster: EmbeddedCluster, directory: Path) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap_servers
        self.source = f"words-{suffix}"
        self.sink = f"counts-{suffix}"
        self.group = f"quix-count-{suffix}"
        self.transactional_id = f"quix-count-{suffix}"
        self.changelog = f"changelog__{self.group}--{self.source}--default"
        self.state_dir = directory / "state"
        self.log = directory / "app.log"
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.feeder = Producer(
            {"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True}
        )
        self.delivery_errors: list[str] = []
        self.random = random.Random(suffix)
        self.app: subprocess.Popen[bytes] | None = None
        # watermarks as each isolation level sees them: the high one, the last stable one
        self.readers = {
            level: Consumer(
                {"bootstrap.servers": self.bootstrap, "group.id": "-", "isolation.level": level}
            )
            for level in ("read_uncommitted", "read_committed")
        }
        self.offsets = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group})
        topics = [
            NewTopic(self.source, INPUT_PARTITIONS, 3, config={"min.insync.replicas": "2"}),
            NewTopic(self.sink, 1, 3, config={"min.insync.replicas": "2"}),
        ]
        for future in self.admin.create_topics(topics).values():
            future.result(30)

    # The app ---------------------------------------------------------------------------

    def start(self) -> None:
        require_quixstreams()
        assert self.app is None
        with self.log.open("ab") as log:
            self.app = subprocess.Popen(
                [
                    str(QUIX_VENV / "bin" / "python"),
                    str(APP),
                    self.bootstrap,
                    self.source,
                    self.sink,
                    self.group,
                    self.transactional_id,
                    str(self.state_dir),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        """SIGTERM: Quix commits its last checkpoint and exits."""
        assert self.app is not None
        self.app.send_signal(signal.SIGTERM)
        try:
            code = self.app.wait(TIMEOUT_S)
        finally:
            self.app.kill()
            self.app.wait()
        self.app = None
        assert code == 0, f"the app exited with {code}:\n{self.log_tail()}"

    def crash(self) -> None:
        """SIGKILL: what the app had open stays open until its successor's InitProducerId."""
        assert self.app is not None
        self.app.kill()
        self.app.wait()
        self.app = None

    def close(self) -> None:
        if self.app is not None:
            self.app.kill()
            self.app.wait()
        for consumer in (*self.readers.values(), self.offsets):
            consumer.close()

    def log_tail(self, lines: int = 40) -> str:
        """The app's own log lines (librdkafka's are left out)."""
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join([line for line in text if not line.startswith("%")][-lines:])

    def wait(self, condition: Callable[[], object], what: str, show: Callable[[], object]) -> None:
        """`wait_for`, failing at once if the app has exited."""

        def running_and() -> object:
            assert self.app is not None
            code = self.app.poll()
            assert code is None, f"the app exited with {code}:\n{self.log_tail()}"
            return condition()

        wait_for(running_and, what, timeout_s=TIMEOUT_S, interval_s=0.2, show=show)

    # Records ---------------------------------------------------------------------------

    def feed(self, records: int) -> None:
        """Records keyed by words, some words far more often than others."""
        for word in self.random.choices(VOCABULARY, range(1, len(VOCABULARY) + 1), k=records):
            self.feeder.produce(self.source, b"1", word.encode(), on_delivery=self._delivered)
        assert self.feeder.flush(TIMEOUT_S) == 0
        assert not self.delivery_errors, self.delivery_errors

    def _delivered(self, error: KafkaError | None, _message: object) -> None:
        if error is not None:
            self.delivery_errors.append(error.str())

    def ends(self, topic: str, partitions: int, level: str = "read_uncommitted") -> list[int]:
        """The high watermarks, or with read_committed the last stable offsets."""

        def ends_now() -> list[int] | None:
            reader = self.readers[level]
            try:
                return [
                    reader.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[1]
                    for p in range(partitions)
                ]
            except KafkaException:
                return None  # leadership moving

        return wait_for(ends_now, f"the end offsets of {topic}", timeout_s=TIMEOUT_S)

    def open_transaction_on_output(self) -> bool:
        """Records of the app's on the output beyond the last stable offset: a transaction
        of its is open. If none is and the app has counted all input, more input."""
        if self.ends(self.sink, 1, "read_committed") < self.ends(self.sink, 1):
            return True
        if self.committed() == self.ends(self.source, INPUT_PARTITIONS):
            self.feed(50)
        return False

    def committed(self) -> list[int]:
        """The app's committed offsets on the input (-1 where none, or unknown)."""
        partitions = [TopicPartition(self.source, p) for p in range(INPUT_PARTITIONS)]
        try:
            return [tp.offset for tp in self.offsets.committed(partitions, 10)]
        except KafkaException:
            return [-1] * INPUT_PARTITIONS

    def wait_all_counted(self) -> None:
        """Until the app has committed the end of every input partition."""
        ends = self.ends(self.source, INPUT_PARTITIONS)
        self.wait(
            lambda: self.committed() == ends,
            f"the app to commit the input's end offsets {ends}",
            show=lambda: (self.committed(), self.log_tail(10)),
        )

    def read(self, topic: str, partitions: int) -> list[tuple[str, bytes]]:
        """Every record of the topic, read committed, to the last stable offsets."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        records: list[tuple[str, bytes]] = []
        at_end: set[int] = set()
        try:
            wait_for(
                lambda: self._read_some(consumer, records, at_end) >= partitions,
                f"the end of {topic}",
                timeout_s=TIMEOUT_S,
                interval_s=0,
                show=lambda: (len(records), at_end),
            )
        finally:
            consumer.close()
        return records

    @staticmethod
    def _read_some(consumer: Consumer, records: list[tuple[str, bytes]], at_end: set[int]) -> int:
        for message in consumer.consume(500, 0.5):
            error = message.error()
            if error is None:
                records.append((message.key().decode(), message.value()))
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
        return len(at_end)

    def assert_counted_exactly_once(self) -> None:
        """Each word's counts on the output are 1..n, once each, in order, n its records."""
        words = Counter(word for word, _ in self.read(self.source, INPUT_PARTITIONS))
        counts: dict[str, list[int]] = defaultdict(list)
        for word, value in self.read(self.sink, 1):
            counts[word].append(json.loads(value)["count"])
        assert set(counts) == set(words)
        for word, n in words.items():
            assert counts[word] == list(range(1, n + 1)), (word, n, counts[word])

    def changelog_as_described(self) -> dict[str, str]:
        """The changelog's partitions, replicas and configs, as the brokers describe it."""
        metadata = self.admin.list_topics(timeout=10).topics[self.changelog]
        resource = ConfigResource(ResourceType.TOPIC, self.changelog)
        configs = self.admin.describe_configs([resource])[resource].result(10)
        return {
            "partitions": str(len(metadata.partitions)),
            "replicas": str(len(metadata.partitions[0].replicas)),
            **{name: entry.value for name, entry in configs.items()},
        }

    # The cluster -----------------------------------------------------------------------

    def watched(self) -> list[tuple[str, int]]:
        """The partitions the app writes or coordinates through."""
        return [
            *((self.source, p) for p in range(INPUT_PARTITIONS)),
            *((self.changelog, p) for p in range(INPUT_PARTITIONS)),
            (self.sink, 0),
            ("__transaction_state", partition_for(self.transactional_id, COORDINATOR_PARTITIONS)),
            ("__consumer_offsets", partition_for(self.group, COORDINATOR_PARTITIONS)),
        ]

    def kill_and_restart(self, victim: int) -> None:
        self.cluster.kill_broker(victim)
        wait_for(
            lambda: all(leader(self.cluster, t, p) not in (victim, -1) for t, p in self.watched()),
            f"leaders other than broker {victim}",
            timeout_s=TIMEOUT_S,
        )
        self.cluster.start_broker(victim)


@pytest.fixture
def pipeline(cluster: EmbeddedCluster, tmp_path: Path) -> Iterator[Pipeline]:
    running = Pipeline(cluster, tmp_path)
    yield running
    running.close()


def test_counts_exactly_once_across_broker_kills_and_an_app_crash(pipeline: Pipeline) -> None:
    cluster = pipeline.cluster
    pipeline.feed(200)
    pipeline.start()
    txn_partition = partition_for(pipeline.transactional_id, COORDINATOR_PARTITIONS)
    victims: list[Callable[[], int]] = [
        lambda: leader(cluster, "__transaction_state", txn_partition),
        lambda: leader(cluster, pipeline.source, 0),
        lambda: leader(cluster, "__transaction_state", txn_partition),
    ]
    for victim_of in victims:
        pipeline.wait(
            lambda: all(len(isr(cluster, t, p)) == 3 for t, p in pipeline.watched()),
            "every replica of the app's partitions in the ISR",
            show=lambda: {(t, p): isr(cluster, t, p) for t, p in pipeline.watched()},
        )
        pipeline.wait(
            pipeline.open_transaction_on_output,
            "an open transaction of the app's on the output",
            show=pipeline.log_tail,
        )
        victim = victim_of()
        assert victim >= 0
        pipeline.kill_and_restart(victim)
    pipeline.wait(
        pipeline.open_transaction_on_output,
        "an open transaction of the app's on the output",
        show=pipeline.log_tail,
    )
    pipeline.crash()
    pipeline.start()
    pipeline.feed(200)
    pipeline.wait_all_counted()
    pipeline.stop()
    pipeline.assert_counted_exactly_once()


def test_counts_go_on_from_the_changelog_after_the_state_is_deleted(pipeline: Pipeline) -> None:
    pipeline.feed(300)
    pipeline.start()
    pipeline.wait_all_counted()
    pipeline.stop()
    changelog = pipeline.changelog_as_described()
    assert {k: changelog[k] for k in ("partitions", "replicas", "cleanup.policy")} == {
        "partitions": str(INPUT_PARTITIONS),
        "replicas": "3",
        "cleanup.policy": "compact",
    }
    assert changelog["min.insync.replicas"] == "2"
    assert any(pipeline.state_dir.iterdir()), "the app kept no local state"
    shutil.rmtree(pipeline.state_dir)
    pipeline.feed(300)
    pipeline.start()
    pipeline.wait_all_counted()
    pipeline.stop()
    pipeline.assert_counted_exactly_once()
