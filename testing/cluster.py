"""`TierbrokerCluster`: a tierbroker cluster in this process, and the helpers tests need.

It runs an `EmbeddedCluster` (brokers on an event loop of their own, in a background
thread, every port bound free, data in the directory given) with settings for tests:
consumer groups rebalance at once, and with tiering the remote-log tasks run every 100 ms
and retry a failed copy within a second. `broker_config` overrides any of them.

The helpers need no client code: topics (`create_topic`, which waits until every replica
is in the ISR), records (`produce`, `records`, `assert_produces`, `committed`), the
remote tier (`tier_state`, `wait_tiered`, `pause_remote` / `resume_remote` for an
object-store outage), and faults (`stop_broker`, `kill_broker`, `start_broker`,
`expire_session`). They block; `aio` has the same helpers as coroutines, for tests on an
event loop (an application under test on that loop keeps running while they wait).
Safe to use from one test thread at a time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tierbroker.broker.replication.replica_selector import RACK_AWARE
from tierbroker.broker.server.embedded import EmbeddedCluster
from tierbroker.storage.topic_partition import TopicPartition
from tierbroker.testing import clients
from tierbroker.testing.aio import AsyncTierbrokerCluster
from tierbroker.testing.clients import ProducedRecord, Record
from tierbroker.testing.outage import CLASS_NAME, DELEGATE, GATE, drop_gate, gate
from tierbroker.testing.views import BrokerInfo, ConfigValue, PartitionTier, Produced

# No free-space floor: a CI runner's small tmpfs would be below the default 1 GiB.
# A short session timeout: a killed broker's session expires (and its leadership moves)
# within seconds; in-process sessions that live never expire, whatever the timeout.
TEST_SETTINGS = {
    "zookeeper.session.timeout.ms": "3000",
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.num.partitions": "5",
    "log.dir.min.free.bytes": "0",
    "log.cleaner.backoff.ms": "100",
}
TIERING_SETTINGS = {
    "remote.log.manager.task.interval.ms": "100",
    "remote.log.manager.task.retry.backoff.ms": "100",
    "remote.log.manager.task.retry.backoff.max.ms": "1000",
    "log.retention.check.interval.ms": "200",
}


@dataclass(frozen=True, slots=True)
class S3Tier:
    """An S3 endpoint (AWS, MinIO, moto) for the remote tier; the bucket must exist."""

    endpoint: str
    bucket: str
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    prefix: str = ""
    path_style: bool = True

    def rsm_configs(self) -> dict[str, str]:
        configs = {
            "storage.s3.endpoint.url": self.endpoint,
            "storage.s3.bucket.name": self.bucket,
            "storage.s3.region": self.region,
            "storage.s3.path.style.access.enabled": str(self.path_style).lower(),
        }
        if self.access_key_id is not None:
            configs["storage.aws.access.key.id"] = self.access_key_id
        if self.secret_access_key is not None:
            configs["storage.aws.secret.access.key"] = self.secret_access_key
        if self.prefix:
            configs["key.prefix"] = self.prefix
        return configs


def _text(value: ConfigValue) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class TierbrokerCluster:
    def __init__(
        self,
        directory: Path,
        brokers: int = 1,
        *,
        racks: Iterable[str] | None = None,
        broker_config: Mapping[str, ConfigValue] | None = None,
        topic_config: Mapping[str, ConfigValue] | None = None,
        tiering: bool = False,
        s3: S3Tier | None = None,
        follower_fetching: bool = False,
    ) -> None:
        """`brokers` in `racks` (in turn), data under `directory`. `tiering`: a remote tier
        in `directory/remote`, or on `s3`; topics made by `create_topic` then tier unless
        their config says `remote.storage.enable=false`. `follower_fetching`: consumers
        read from the replica in their rack (`replica.selector.class`, KIP-392).
        `topic_config`: defaults of `create_topic`."""
        tiering = tiering or s3 is not None
        self.gate_name = f"tierbroker-{uuid.uuid4()}"
        settings: dict[str, str] = {
            **TEST_SETTINGS,
            "remote.log.storage.system.enable": str(tiering).lower(),
        }
        if tiering:
            settings.update(TIERING_SETTINGS)
            settings["remote.log.storage.manager.class.name"] = CLASS_NAME
            settings[f"rsm.config.{GATE}"] = self.gate_name
            if s3 is not None:
                settings[f"rsm.config.{DELEGATE}"] = "s3"
                settings.update({f"rsm.config.{k}": v for k, v in s3.rsm_configs().items()})
            else:
                settings["rsm.config.dir"] = str(directory / "remote")
        if follower_fetching:
            settings["replica.selector.class"] = RACK_AWARE
        settings.update({k: _text(v) for k, v in (broker_config or {}).items()})
        self.tiering = tiering
        self.topic_config = {k: _text(v) for k, v in (topic_config or {}).items()}
        if tiering:
            self.topic_config.setdefault("remote.storage.enable", "true")
        self.embedded = EmbeddedCluster(directory / "brokers", brokers, list(racks or []), settings)

    # Lifecycle -----------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> TierbrokerCluster:
        self.embedded.start(timeout_s)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop every broker; idempotent."""
        try:
            self.embedded.stop(timeout_s)
        finally:
            drop_gate(self.gate_name)

    def __enter__(self) -> TierbrokerCluster:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def aio(self) -> AsyncTierbrokerCluster:
        """The helpers as coroutines."""
        return AsyncTierbrokerCluster(self)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
        """Poll `condition()` (which may use the helpers) until it holds; AssertionError
        naming `what` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
            time.sleep(0.02)

    # Where it is ---------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for b in self.brokers if b.running)

    @property
    def brokers(self) -> list[BrokerInfo]:
        def read() -> list[BrokerInfo]:
            infos = []
            for server in self.embedded.brokers:
                metrics_port = server.endpoints.metrics_port
                infos.append(
                    BrokerInfo(
                        broker_id=server.broker_id,
                        host=server.endpoints.host,
                        port=server.endpoints.port,
                        rack=server.config.broker_rack,
                        metrics_url=(
                            f"http://{server.endpoints.host}:{metrics_port}"
                            if metrics_port is not None
                            else None
                        ),
                        running=server.running,
                    )
                )
            return infos

        return self.embedded.read(read)

    def broker(self, broker_id: int) -> BrokerInfo:
        return next(b for b in self.brokers if b.broker_id == broker_id)

    def address(self, broker_id: int) -> str:
        return self.broker(broker_id).address

    @property
    def controller(self) -> int:
        """The broker that is the controller now (-1: none)."""

        def read() -> int:
            running = [b for b in self.embedded.brokers if b.running]
            return running[0].cache.controller_id if running else -1

        return self.embedded.read(read)

    def leader(self, topic: str, partition: int = 0) -> int:
        """The partition's leader (-1: none), as the controller last decided."""
        return self.embedded.read(lambda: self._state(TopicPartition(topic, partition))[0])

    def isr(self, topic: str, partition: int = 0) -> set[int]:
        return self.embedded.read(lambda: set(self._state(TopicPartition(topic, partition))[1]))

    def _state(self, tp: TopicPartition) -> tuple[int, tuple[int, ...]]:
        for server in self.embedded.brokers:
            if server.running:
                state = server.cache.states.get(tp)
                return (state.leader, state.isr) if state is not None else (-1, ())
        raise AssertionError("no broker is running")

    def metric(self, name: str, broker: int | None = None, **labels: str) -> float:
        """A metric's value (`ConsumerBytesOut_total`, `RemoteCopyRequestsPerSec_total`, ...),
        summed over the brokers (or of one broker) and over the labels not given."""

        def read() -> float:
            total = 0.0
            for server in self.embedded.brokers:
                if broker is not None and server.broker_id != broker:
                    continue
                for family in server.registry.collect():
                    for sample in family.samples:
                        if sample.name == name and all(
                            sample.labels.get(k) == v for k, v in labels.items()
                        ):
                            total += sample.value
            return total

        return self.embedded.read(read)

    # Topics and records --------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, ConfigValue] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """Create a topic (replication factor: the brokers running, up to 3) and wait until
        every replica has it and is in the ISR."""
        configs = {**self.topic_config, **{k: _text(v) for k, v in (config or {}).items()}}
        running = self.embedded.read(lambda: [b for b in self.embedded.brokers if b.running])
        assert running, "no broker is running"
        factor = replication_factor or min(3, len(running))
        self.embedded.call(
            running[0].admin.create_topic(name, partitions, factor, configs), timeout_s
        )
        self.wait_for(
            lambda: self.embedded.read(lambda: self._topic_ready(name)),
            f"every replica of {name} in its ISR",
            timeout_s,
        )

    def _topic_ready(self, name: str) -> bool:
        running = {b.broker_id: b for b in self.embedded.brokers if b.running}
        for server in running.values():
            assignment = server.cache.topics.get(name)
            if assignment is None or not server.cache.has_leaders(name):
                return False
            for partition, replicas in assignment.partitions.items():
                tp = TopicPartition(name, partition)
                state = server.cache.states.get(tp)
                if state is None or state.leader not in running:
                    return False
                live = {r for r in replicas if r in running}
                if not live <= set(state.isr):
                    return False
                if any(tp not in running[r].replicas.partitions for r in live):
                    return False
        return True

    def produce(
        self,
        topic: str,
        records: Iterable[ProducedRecord],
        partition: int | None = None,
        headers: dict[str, bytes] | None = None,
        timeout_s: float = 30.0,
    ) -> list[tuple[int, int]]:
        """Produce values (or (key, value) pairs) with acks=all; each one's (partition,
        offset). Without `partition`, the producer's partitioner picks it."""
        return clients.produce(
            self.bootstrap_servers, topic, records, partition, headers, timeout_s
        )

    def end_offsets(self, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
        """Each partition's high watermark, from its leader. A new leader's is taken once it
        reaches the start of its leader epoch (before, ListOffsets answers OFFSET_NOT_AVAILABLE)."""

        def read() -> dict[int, int] | None:
            ends = {}
            servers = {b.broker_id: b for b in self.embedded.brokers if b.running}
            for server in servers.values():
                assignment = server.cache.topics.get(topic)
                assert assignment is not None, f"topic {topic} does not exist"
                for partition in assignment.partitions:
                    tp = TopicPartition(topic, partition)
                    leader = servers.get(self._state(tp)[0])
                    hosted = leader.replicas.partitions.get(tp) if leader else None
                    if hosted and hosted.leader_epoch_start_offset > hosted.high_watermark:
                        return None
                    ends[partition] = hosted.high_watermark if hosted else -1
                return ends
            raise AssertionError("no broker is running")

        found: dict[int, int] = {}

        def known() -> bool:
            ends = self.embedded.read(read)
            found.update(ends or {})
            return ends is not None

        self.wait_for(known, f"the leaders of {topic} to know their high watermarks", timeout_s)
        return found

    def records(
        self,
        topic: str,
        partition: int = 0,
        from_offset: int = 0,
        client_rack: str | None = None,
        timeout_s: float = 30.0,
    ) -> list[Record]:
        """The partition's records from `from_offset` to its high watermark now, decoded,
        read as a consumer reads them (in `client_rack`, if given)."""
        end = self.end_offsets(topic)[partition]
        return clients.read(
            self.bootstrap_servers, topic, partition, from_offset, end, timeout_s, client_rack
        )

    @contextmanager
    def assert_produces(
        self, topic: str, count: int, timeout_s: float = 10.0
    ) -> Iterator[Produced]:
        """Asserts that exactly `count` records reach `topic` from the start of the `with`
        block until `timeout_s` after its end; the result holds them once it ends."""
        before = self.end_offsets(topic)
        produced = Produced()
        yield produced
        produced.records = self.wait_produced(topic, count, before, timeout_s)

    def wait_produced(
        self, topic: str, count: int, before: dict[int, int], timeout_s: float
    ) -> list[Record]:
        """The records past the `before` end offsets once there are `count` of them, or
        `timeout_s` passed; AssertionError unless there are exactly `count`."""
        deadline = time.monotonic() + timeout_s
        while True:
            ends = self.end_offsets(topic)
            added = sum(end - before.get(p, 0) for p, end in ends.items())
            if added >= count or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        found = [
            record
            for p, end in sorted(ends.items())
            for record in clients.read(
                self.bootstrap_servers, topic, p, before.get(p, 0), end, timeout_s
            )
        ]
        assert len(found) == count, (
            f"expected {count} records produced to {topic}, got {len(found)} in {timeout_s:g}s"
        )
        return found

    def committed(self, group: str, timeout_s: float = 30.0) -> dict[tuple[str, int], int]:
        """The group's committed offsets by (topic, partition)."""
        return clients.committed(self.bootstrap_servers, group, timeout_s)

    # The remote tier -----------------------------------------------------------------

    def tier_state(self, topic: str) -> dict[int, PartitionTier]:
        """Each partition's local and remote segments and copy lag, from its leader; a
        partition whose leader is not tiering it (yet) is left out."""
        assert self.tiering, "the cluster has no remote tier: start it with tiering=True"

        def read() -> dict[int, PartitionTier]:
            rows = {}
            for server in self.embedded.brokers:
                if not server.running or server.remote is None:
                    continue
                for row in server.remote.status():
                    if row["topic"] == topic:
                        fields = {k: v for k, v in row.items() if k != "topic"}
                        rows[row["partition"]] = PartitionTier(leader=server.broker_id, **fields)
            return dict(sorted(rows.items()))

        return self.embedded.read(read)

    def wait_tiered(self, topic: str, timeout_s: float = 30.0) -> dict[int, PartitionTier]:
        """Wait until every rolled segment of every partition is in the remote tier (the
        active segment never is); the partitions' tiers then."""
        partitions = set(self.end_offsets(topic))
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.tier_state(topic)
            if set(state) == partitions and all(p.copy_lag_segments == 0 for p in state.values()):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{topic} not tiered after {timeout_s:g}s: {list(state.values())}"
                )
            time.sleep(0.05)

    def pause_remote(self) -> None:
        """An object-store outage: every remote storage call of every broker fails until
        `resume_remote`."""
        assert self.tiering, "the cluster has no remote tier: start it with tiering=True"
        gate(self.gate_name).pause()

    def resume_remote(self) -> None:
        gate(self.gate_name).resume()

    # Faults --------------------------------------------------------------------------

    def stop_broker(self, broker_id: int, timeout_s: float = 30.0) -> None:
        """Stop a broker cleanly: its leadership moves away first (controlled shutdown).
        Returns once the other brokers see it gone."""
        self.embedded.stop_broker(broker_id)
        self._wait_seen(broker_id, False, timeout_s)

    def kill_broker(self, broker_id: int, timeout_s: float = 30.0) -> None:
        """Crash a broker: its connections drop, nothing is flushed or checkpointed (no
        `.kafka_cleanshutdown`), and its metadata session is left to expire, after
        which the controller gives its partitions new leaders. `start_broker` then runs
        log recovery. Returns once the other brokers see it gone and it leads nothing."""
        self.embedded.kill_broker(broker_id)
        self._wait_seen(broker_id, False, timeout_s)

    def start_broker(self, broker_id: int, timeout_s: float = 30.0) -> None:
        """Start a stopped broker again, on its port, with its data. Returns once every
        broker sees it; it rejoins ISRs when it has caught up."""
        self.embedded.start_broker(broker_id)
        self._wait_seen(broker_id, True, timeout_s)

    def _wait_seen(self, broker_id: int, live: bool, timeout_s: float) -> None:
        def unseen() -> list[str]:
            """What some broker still believes otherwise."""
            wrong = []
            for server in self.embedded.brokers:
                if not server.running:
                    continue
                if (broker_id in server.cache.brokers) != live:
                    wrong.append(f"broker {server.broker_id}'s list of live brokers")
                if not live:
                    wrong += [
                        f"{tp} {state} (broker {server.broker_id}'s view)"
                        for tp, state in server.cache.states.items()
                        if state.leader == broker_id
                        or (broker_id in state.isr and len(state.isr) > 1)
                    ]
            return wrong

        deadline = time.monotonic() + timeout_s
        while wrong := self.embedded.read(unseen):
            if time.monotonic() > deadline:
                gone = "gone" if not live else "back"
                raise AssertionError(
                    f"broker {broker_id} not seen {gone} within {timeout_s:g}s: {wrong[:5]}"
                )
            time.sleep(0.02)

    def expire_session(self, broker_id: int) -> None:
        """The broker's metadata-store session expires (as a ZooKeeper session does): it
        registers again, and the controller reacts as to a broker that left and came back."""
        self.embedded.expire_session(broker_id)
