"""Helpers shared by the tiered-storage integration tests (test_tiering, test_tiering_resilience).

- `Tier`: the remote tier a broker is started with (LocalFs in `<tmp>/logs/remote`, or S3 on
  moto's standalone server), its broker overrides, and a listing of its objects.
- `status` / `metrics`: the broker's `/tier/status` rows and Prometheus values.
- Records are keyed and valued by their offset (`key_of`, `value_of`), with the
  timestamp `timestamp_of(offset)`, so any reader's output can be checked exactly.
- Readers from offset 0 with confluent-kafka, kcat and aiokafka; raw ListOffsets and
  Fetch through `wire.WireClient`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kio.index import load_payload_module
from kio.static.constants import EntityType

from tests.integration.broker_process import BrokerProcess, executable
from tests.integration.wire import WireClient

MIB = 1 << 20
T = TypeVar("T")

EARLIEST, LATEST = -2, -1
EARLIEST_LOCAL, LATEST_TIERED, EARLIEST_PENDING_UPLOAD = -4, -5, -6
REQUEST_TIMED_OUT = 7
OFFSET_OUT_OF_RANGE = 1

# Timestamps of the records: a millisecond apart, in the recent past (retention.ms keeps them).
BASE_TIMESTAMP_MS = int(time.time() * 1000) - 30 * 60 * 1000


# Records --------------------------------------------------------------------------------

_FILL = bytes(range(97, 123)) * 800  # a-z, enough for any value size used here


def key_of(i: int) -> bytes:
    return b"%08d" % i


def value_of(i: int, size: int) -> bytes:
    """`size` bytes, unique to record `i` (its number first, then letters shifted by it)."""
    head = b"%08d:" % i
    start = i % 26
    return head + _FILL[start : start + size - len(head)]


def timestamp_of(i: int) -> int:
    return BASE_TIMESTAMP_MS + i


@dataclass
class ProduceReport:
    count: int
    seconds: float
    latencies_s: list[float] = field(default_factory=list)

    @property
    def max_latency_s(self) -> float:
        return max(self.latencies_s, default=0.0)


def produce(
    bootstrap: str,
    topic: str,
    start: int,
    count: int,
    value_size: int,
    *,
    acks: str = "1",
    timeout_s: float = 120,
    linger_ms: int = 5,
    batch_size: int | None = None,
) -> ProduceReport:
    """Produce records `start`..`start+count-1` to partition 0 with confluent-kafka and wait
    for every delivery report; fails on any delivery error. Records each delivery latency."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "linger.ms": linger_ms,
            "enable.idempotence": False,
            "message.timeout.ms": int(timeout_s * 1000),
            **({"batch.size": batch_size} if batch_size is not None else {}),
        }
    )
    errors: list[str] = []
    latencies: list[float] = []
    started = time.monotonic()

    def on_delivery(sent_at: float) -> Callable[[Any, Any], None]:
        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            latencies.append(time.monotonic() - sent_at)

        return report

    for i in range(start, start + count):
        while True:
            try:
                producer.produce(
                    topic,
                    value_of(i, value_size),
                    key_of(i),
                    partition=0,
                    timestamp=timestamp_of(i),
                    on_delivery=on_delivery(time.monotonic()),
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(timeout_s)
    assert left == 0, f"{left} records not delivered within {timeout_s}s"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[0]}"
    assert len(latencies) == count
    return ProduceReport(count, time.monotonic() - started, latencies)


def check_records(
    got: list[tuple[int, bytes | None, bytes | None]], start: int, count: int, value_size: int
) -> None:
    """`got` is exactly records start..start+count-1, in order, keys and values intact."""
    assert len(got) == count, f"read {len(got)} records, expected {count}"
    for n, (offset, key, value) in enumerate(got):
        i = start + n
        if offset != i or key != key_of(i) or value != value_of(i, value_size):
            raise AssertionError(
                f"record #{n}: offset {offset} key {key!r} value {(value or b'')[:20]!r}..., "
                f"expected offset {i} key {key_of(i)!r}"
            )


# Polling --------------------------------------------------------------------------------


# The broker's status and metrics -------------------------------------------------------


def _get(broker: BrokerProcess, path: str) -> bytes:
    url = f"http://127.0.0.1:{broker.metrics_port}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


def all_status(broker: BrokerProcess) -> list[dict[str, Any]]:
    return list(json.loads(_get(broker, "/tier/status")))


def status(broker: BrokerProcess, topic: str, partition: int = 0) -> dict[str, Any]:
    """The `/tier/status` row of a partition ({} if there is none)."""
    return next(
        (r for r in all_status(broker) if r["topic"] == topic and r["partition"] == partition), {}
    )


def metrics(broker: BrokerProcess) -> str:
    return _get(broker, "/metrics").decode()


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one Prometheus sample (None if absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


def check_rebuilt_from_the_tail(value: Callable[[str], float], produced_bytes: int) -> None:
    """A follower whose log was erased rebuilt it from the remote tier: it took a remote
    segment's auxiliary state at least once and fetched from its leader less than half of
    what was produced (the leader's local tail, not the log from offset 0). `value` reads
    one of its metrics of the topic by name."""
    assert value("BuildRemoteLogAuxStateRequestsPerSec_total") >= 1
    fetched = value("ReplicationBytesInPerSec_total")
    assert fetched < produced_bytes / 2, f"fetched {fetched} of {produced_bytes} bytes"


# Remote tiers ---------------------------------------------------------------------------

SEGMENT_KEY = re.compile(r"/(\d{20})-[^/]+\.log$")


class Tier:
    """A remote tier for one broker: its overrides and what it holds."""

    name = ""

    def overrides(self) -> dict[str, str]:
        raise NotImplementedError

    def objects(self, topic: str) -> dict[str, int]:
        """Every object (key or relative path -> size) under `topic`'s prefix."""
        raise NotImplementedError

    def segment_objects(self, topic: str) -> dict[str, int]:
        """The segment data objects (`.log`) of the topic, key -> size."""
        return {k: v for k, v in self.objects(topic).items() if k.endswith(".log")}

    def stop(self) -> None:
        pass


class LocalFsTier(Tier):
    name = "localfs"

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "logs" / "remote"  # log.dirs=<tmp>/logs: the default dir

    def overrides(self) -> dict[str, str]:
        return {"remote.log.storage.manager.class.name": "localfs"}

    def objects(self, topic: str) -> dict[str, int]:
        if not self.root.exists():
            return {}
        found = {}
        for p in self.root.rglob("*"):
            relative = "/" + str(p.relative_to(self.root))
            if p.is_file() and f"/{topic}-" in relative:
                try:
                    found[relative] = p.stat().st_size
                except FileNotFoundError:  # deleted by the broker since it was listed
                    continue
        return found


class S3Tier(Tier):
    name = "s3"
    bucket = "tiered-bucket"

    def __init__(self) -> None:
        from tests.integration.moto_server import MotoServer

        self.moto = MotoServer().start()
        self.moto.create_bucket(self.bucket)
        self._client = self.moto.client()

    def overrides(self) -> dict[str, str]:
        return {
            "remote.log.storage.manager.class.name": "s3",
            "rsm.config.storage.s3.bucket.name": self.bucket,
            "rsm.config.storage.s3.region": "us-east-1",
            "rsm.config.storage.s3.endpoint.url": self.moto.endpoint,
            "rsm.config.storage.s3.path.style.access.enabled": "true",
            "rsm.config.storage.aws.access.key.id": "testing",
            "rsm.config.storage.aws.secret.access.key": "testing",
        }

    def objects(self, topic: str) -> dict[str, int]:
        found = {}
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for o in page.get("Contents", []):
                if f"/{topic}-" in "/" + o["Key"]:
                    found["/" + o["Key"]] = int(o["Size"])
        return found

    def stop(self) -> None:
        self.moto.stop()


def segment_start(key: str) -> int:
    match = SEGMENT_KEY.search(key)
    assert match, key
    return int(match.group(1))


# Readers --------------------------------------------------------------------------------


@dataclass
class ReadResult:
    records: list[tuple[int, bytes | None, bytes | None]]
    errors: list[str]
    seconds: float


def read_confluent(
    bootstrap: str,
    topic: str,
    start: int,
    count: int,
    timeout_s: float = 120,
    **conf: Any,
) -> ReadResult:
    """Read `count` records of partition 0 from `start` with confluent-kafka.

    REQUEST_TIMED_OUT partition errors (a remote read outlived remote.fetch.max.wait.ms; the
    client retries) are tolerated and returned; any other error fails."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            **conf,
        }
    )
    consumer.assign([TopicPartition(topic, 0, start)])
    got: list[tuple[int, bytes | None, bytes | None]] = []
    errors: list[str] = []
    started = time.monotonic()
    deadline = started + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            for m in consumer.consume(10_000, 0.5):
                err = m.error()
                if err is None:
                    got.append((m.offset(), m.key(), m.value()))
                elif err.code() == KafkaError.REQUEST_TIMED_OUT:
                    errors.append(str(err))
                else:
                    raise AssertionError(f"consumer error after {len(got)} records: {err}")
    finally:
        consumer.close()
    return ReadResult(got, errors, time.monotonic() - started)


def read_kcat(bootstrap: str, topic: str, timeout_s: float = 120) -> ReadResult:
    """`kcat -C -o beginning -e`: every record of partition 0 as offset, key, value."""
    kcat = executable("kcat", "apt-get install -y kcat")
    started = time.monotonic()
    done = subprocess.run(
        [
            kcat,
            "-b",
            bootstrap,
            "-C",
            "-t",
            topic,
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%o %k %s\\n",
        ],
        capture_output=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    records: list[tuple[int, bytes | None, bytes | None]] = []
    for line in done.stdout.splitlines():
        offset, key, value = line.split(b" ")
        records.append((int(offset), key, value))
    errors = [ln for ln in done.stderr.decode(errors="replace").splitlines() if ln.strip()]
    return ReadResult(records, errors, time.monotonic() - started)


def read_aiokafka(bootstrap: str, topic: str, count: int, timeout_s: float = 120) -> ReadResult:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    async def run() -> list[tuple[int, bytes | None, bytes | None]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
        )
        await consumer.start()
        got: list[tuple[int, bytes | None, bytes | None]] = []
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            deadline = time.monotonic() + timeout_s
            while len(got) < count and time.monotonic() < deadline:
                batches = await consumer.getmany(tp, timeout_ms=1000, max_records=20_000)
                for records in batches.values():
                    got += [(r.offset, r.key, r.value) for r in records]
        finally:
            await consumer.stop()
        return got

    started = time.monotonic()
    records = asyncio.run(run())
    return ReadResult(records, [], time.monotonic() - started)


# Raw requests ---------------------------------------------------------------------------


def _module(api_key: int, version: int) -> Any:
    return load_payload_module(api_key, version, EntityType.request)


def list_offsets(
    port: int, topic: str, timestamp: int, version: int = 11, timeout_ms: int = 10_000
) -> tuple[int, int, int, int, float]:
    """ListOffsets of partition 0: (error, offset, timestamp, leader epoch, seconds taken)."""
    m = _module(2, version)
    partition = m.ListOffsetsPartition(
        partition_index=0, current_leader_epoch=-1, timestamp=timestamp
    )
    request = m.ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=(m.ListOffsetsTopic(name=topic, partitions=(partition,)),),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
    )
    with WireClient(port, timeout_s=120) as client:
        started = time.monotonic()
        response = client.request(request)
        elapsed = time.monotonic() - started
    (p,) = response.topics[0].partitions
    return int(p.error_code), int(p.offset), int(p.timestamp), int(p.leader_epoch), elapsed


@dataclass
class FetchAnswer:
    error: int
    records: bytes
    high_watermark: int
    log_start_offset: int
    seconds: float


def fetch(
    port: int,
    topic: str,
    offset: int,
    *,
    max_wait_ms: int = 100,
    partition_max_bytes: int = MIB,
    max_bytes: int = 50 * MIB,
    socket_timeout_s: float = 60,
    client: WireClient | None = None,
) -> FetchAnswer:
    """One raw Fetch (v12, by topic name) of partition 0 at `offset`."""
    m = _module(1, 12)
    request = m.FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            m.FetchTopic(
                topic=topic,
                partitions=(
                    m.FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=partition_max_bytes,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    own = client is None
    c = client if client is not None else WireClient(port, timeout_s=socket_timeout_s)
    try:
        started = time.monotonic()
        response = c.request(request)
        elapsed = time.monotonic() - started
    finally:
        if own:
            c.close()
    p = response.responses[0].partitions[0]
    return FetchAnswer(
        int(p.error_code),
        bytes(p.records or b""),
        int(p.high_watermark),
        int(p.log_start_offset),
        elapsed,
    )


def decode(records: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    from tierbroker.protocol.records import decode_records

    return [(r.offset, r.key, r.value) for r in decode_records(records)]
