"""`tierbroker demo`: a racked, tiered cluster at work, in this process, in under a minute.

Three brokers in racks a, b and c start on free ports, with a LocalFs remote tier and
Kafka's `RackAwareReplicaSelector`, data in a temp dir (or `--dir`). The demo creates a
topic of 3 partitions with small segments and a short local retention, produces into it
while a table shows each partition's tiers live (local and remote bytes, copy lag), waits
until every rolled segment is tiered and the local tier let go of them, then reads the
topic from offset 0 twice: through the broker in the client's rack (a consumer with
`client.rack=b`: the leader or a follower, each serving old offsets from the remote
tier), and straight from the object store (`TieredConsumer`, REMOTE_ONLY). It ends with
what the brokers' metrics say: bytes per tier, bytes served per broker, same-rack and
cross-rack, and the remote tier's requests. Broker logs go to `brokers.log` there.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from tierbroker.broker.replication.replica_selector import RACK_AWARE
from tierbroker.broker.server.embedded import EmbeddedCluster

TOPIC = "demo-clicks"
PARTITIONS = 3
RACKS = ["a", "b", "c"]
CLIENT_RACK = "b"
RECORD_BYTES = 1024
SEGMENTS_PER_PARTITION = 8  # about, for the data produced
WAIT_S = 40.0


@dataclass
class BrokerUse:
    """One broker's share, as its metrics and logs tell it."""

    broker_id: int
    rack: str
    leads: int  # partitions of the topic it leads
    local_bytes: int  # the topic's bytes in its local tier
    same_rack_bytes: float  # ConsumerBytesOut: consumers in its rack
    cross_rack_bytes: float
    unknown_rack_bytes: float  # consumer or broker without a rack
    segments_copied: float  # RemoteCopyRequestsPerSec
    remote_reads: float  # RemoteFetchRequestsPerSec: fetches served from the remote tier


@dataclass
class DemoReport:
    records: int = 0
    produced_bytes: int = 0  # record values
    remote_bytes: int = 0  # the topic's bytes in the remote tier, from its leaders
    remote_segments: int = 0
    brokers: list[BrokerUse] = field(default_factory=list)
    rack_read_records: int = 0
    rack_read_s: float = 0.0
    direct_records: int = 0
    direct_bytes: int = 0  # read straight from the object store
    direct_s: float = 0.0


class Demo:
    def __init__(self, directory: Path, mib: float, console: Console) -> None:
        self.directory = directory
        self.records = max(
            PARTITIONS * SEGMENTS_PER_PARTITION, int(mib * 1024 * 1024) // RECORD_BYTES
        )
        per_partition = self.records * RECORD_BYTES // PARTITIONS
        self.segment_bytes = max(16 * 1024, per_partition // SEGMENTS_PER_PARTITION)
        self.console = console
        self.remote_dir = directory / "remote"
        self.cluster = EmbeddedCluster(
            directory / "brokers",
            brokers=3,
            racks=RACKS,
            properties={
                "broker.id": "1",
                "replica.selector.class": RACK_AWARE,
                "remote.log.storage.system.enable": "true",
                "rsm.config.dir": str(self.remote_dir),
                "remote.log.manager.task.interval.ms": "200",
                "log.retention.check.interval.ms": "200",
                "group.initial.rebalance.delay.ms": "0",
            },
        )

    @contextmanager
    def running(self) -> Iterator[Demo]:
        handler = logging.FileHandler(self.directory / "brokers.log")
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger("tierbroker")
        level = root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False  # the brokers' lines go to the file, not the screen
        try:
            started = time.monotonic()
            self.cluster.start()
            self.console.print(
                f"3 brokers in racks a, b, c started in {time.monotonic() - started:.2f} s: "
                f"{self.cluster.bootstrap_servers}"
            )
            yield self
        finally:
            self.cluster.stop()
            root.removeHandler(handler)
            root.setLevel(level)
            root.propagate = True
            handler.close()

    # The steps -------------------------------------------------------------------------

    def run(self) -> DemoReport:
        report = DemoReport(records=self.records, produced_bytes=self.records * RECORD_BYTES)
        self._create_topic()
        self.console.print(
            f"topic {TOPIC}: {PARTITIONS} partitions on every broker, segments of "
            f"{human_size(self.segment_bytes)}, local retention 1 s, "
            f"remote tier in {self.remote_dir}"
        )
        self._produce_while_watching()
        started = time.monotonic()
        report.rack_read_records = self._read_in_rack()
        report.rack_read_s = time.monotonic() - started
        started = time.monotonic()
        report.direct_records, report.direct_bytes = asyncio.run(self._read_object_store())
        report.direct_s = time.monotonic() - started
        self._fill(report)
        return report

    def _create_topic(self) -> None:
        configs = {
            "remote.storage.enable": "true",
            "segment.bytes": str(self.segment_bytes),
            "local.retention.ms": "1000",
        }
        admin = self.cluster.brokers[0].admin
        self.cluster.call(admin.create_topic(TOPIC, PARTITIONS, 3, configs))

    def _produce_while_watching(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.cluster.bootstrap_servers,
                "acks": "all",
                "linger.ms": 5,
                "batch.size": min(64 * 1024, self.segment_bytes // 2),
                "log_level": 0,
            }
        )
        errors: list[Any] = []
        done = threading.Event()

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                errors.append(error)

        def produce() -> None:
            value = b"x" * RECORD_BYTES
            for i in range(self.records):
                while True:
                    try:
                        producer.produce(
                            TOPIC,
                            value,
                            key=b"%d" % i,
                            on_delivery=delivered,
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            unsent = producer.flush(60)
            if unsent:
                errors.append(f"{unsent} records still unsent after 60 s")
            done.set()

        producing = threading.Thread(target=produce, name="demo-producer", daemon=True)
        started = time.monotonic()
        producing.start()
        with Live(self._progress(), console=self.console, refresh_per_second=8) as live:
            while True:
                rows = self._tier_rows()
                live.update(self._progress(rows, produced=done.is_set()))
                if done.is_set() and self._settled(rows):
                    break
                if time.monotonic() - started > WAIT_S:
                    self.console.print("[yellow]tiering not finished: showing where it stands")
                    break
                time.sleep(0.125)
        producing.join()
        if errors:
            raise RuntimeError(f"{len(errors)} records not acknowledged, first: {errors[0]}")
        self.console.print(
            f"produced {self.records} records ({human_size(self.records * RECORD_BYTES)}) with "
            f"acks=all and tiered them in {time.monotonic() - started:.1f} s"
        )

    def _settled(self, rows: list[dict[str, Any]]) -> bool:
        """Every rolled segment copied, and the local tier let go of the copied ones."""
        return len(rows) == PARTITIONS and all(
            r["copy_lag_segments"] == 0
            and r["remote_segments"] > 0
            and r["local_log_start_offset"] > r["log_start_offset"]
            for r in rows
        )

    def _read_in_rack(self) -> int:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError
        from confluent_kafka import TopicPartition as Assigned

        consumer = Consumer(
            {
                "bootstrap.servers": self.cluster.bootstrap_servers,
                "group.id": "demo-reader",
                "client.rack": CLIENT_RACK,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "log_level": 0,
            }
        )
        consumer.assign([Assigned(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        read, ended = 0, set[int]()
        deadline = time.monotonic() + WAIT_S
        try:
            while len(ended) < PARTITIONS and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                error = message.error()
                if error is None:
                    read += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition() or 0)
        finally:
            consumer.close()
        self.console.print(
            f"a consumer in rack {CLIENT_RACK} read {read} records from offset 0 through "
            "the broker in its rack"
        )
        return read

    async def _read_object_store(self) -> tuple[int, int]:
        from aiokafka.structs import TopicPartition as Assigned

        from tierbroker.pipeline import ConsumptionMode, TieredConsumer

        consumer = TieredConsumer(
            mode=ConsumptionMode.REMOTE_ONLY,
            storage=self.remote_dir.resolve().as_uri(),
            bootstrap_servers=self.cluster.bootstrap_servers,
            bounded=True,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            consumer.assign([Assigned(TOPIC, p) for p in range(PARTITIONS)])
            records = 0
            while batch := await consumer.getmany(timeout_ms=1000):
                records += sum(len(r) for r in batch.values())
            remote_bytes = sum(consumer.stats.remote_bytes.values())
        finally:
            await consumer.stop()
        self.console.print(
            f"TieredConsumer read the {records} tiered records ({human_size(remote_bytes)}) "
            "straight from the object store, no broker serving a byte"
        )
        return records, remote_bytes

    # What the brokers say ----------------------------------------------------------------

    def _tier_rows(self) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            return [
                {**row, "leader": b.broker_id}
                for b in self.cluster.brokers
                if b.remote is not None
                for row in b.remote.status()
                if row["topic"] == TOPIC
            ]

        return sorted(self.cluster.read(read), key=lambda r: r["partition"])

    def _fill(self, report: DemoReport) -> None:
        rows = self._tier_rows()
        report.remote_bytes = sum(r["remote_bytes"] for r in rows)
        report.remote_segments = sum(r["remote_segments"] for r in rows)
        leads = {b: sum(1 for r in rows if r["leader"] == b) for b in (1, 2, 3)}

        def read() -> list[BrokerUse]:
            uses = []
            for b in self.cluster.brokers:
                samples = [
                    s
                    for family in b.registry.collect()
                    for s in family.samples
                    if s.labels.get("topic") == TOPIC
                ]
                uses.append(
                    BrokerUse(
                        broker_id=b.broker_id,
                        rack=b.config.broker_rack or "",
                        leads=leads.get(b.broker_id, 0),
                        local_bytes=sum(
                            p.log.size_in_bytes
                            for tp, p in b.replicas.partitions.items()
                            if tp.topic == TOPIC
                        ),
                        same_rack_bytes=_sum(samples, "ConsumerBytesOut_total", "same-rack"),
                        cross_rack_bytes=_sum(samples, "ConsumerBytesOut_total", "cross-rack"),
                        unknown_rack_bytes=_sum(samples, "ConsumerBytesOut_total", "unknown"),
                        segments_copied=_sum(samples, "RemoteCopyRequestsPerSec_total"),
                        remote_reads=_sum(samples, "RemoteFetchRequestsPerSec_total"),
                    )
                )
            return uses

        report.brokers = self.cluster.read(read)

    # Display -------------------------------------------------------------------------

    def _progress(self, rows: list[dict[str, Any]] | None = None, produced: bool = False) -> Table:
        table = Table(
            title=f"{TOPIC}: " + ("produced, tiering" if produced else "producing and tiering"),
            title_justify="left",
        )
        for column in ("partition", "leader", "log end", "local tier", "remote tier", "copy lag"):
            table.add_column(column, justify="right")
        for r in rows or []:
            table.add_row(
                str(r["partition"]),
                f"{r['leader']} ({RACKS[r['leader'] - 1]})",
                str(r["log_end_offset"]),
                f"{r['local_segments']} seg {human_size(r['local_bytes'])}",
                f"{r['remote_segments']} seg {human_size(r['remote_bytes'])}",
                f"{r['copy_lag_segments']} seg {human_size(r['copy_lag_bytes'])}",
            )
        return table


def report_tables(report: DemoReport) -> Group:
    """The demo's closing tables."""
    brokers = Table(title="where the bytes are, and who served them", title_justify="left")
    brokers.add_column("")
    for b in report.brokers:
        brokers.add_column(f"broker {b.broker_id} ({b.rack})", justify="right")
    brokers.add_column("total", justify="right")

    def row(label: str, values: list[float], total: float | None = None, size: bool = True) -> None:
        shown = [human_size(v) if size else f"{v:.0f}" for v in values]
        whole = sum(values) if total is None else total
        brokers.add_row(label, *shown, human_size(whole) if size else f"{whole:.0f}")

    row("led partitions", [b.leads for b in report.brokers], size=False)
    row("local tier", [b.local_bytes for b in report.brokers])
    brokers.add_row("remote tier", *[""] * len(report.brokers), human_size(report.remote_bytes))
    row("same-rack reads", [b.same_rack_bytes for b in report.brokers])
    row("cross-rack reads", [b.cross_rack_bytes for b in report.brokers])
    row("reads, rack unknown", [b.unknown_rack_bytes for b in report.brokers])
    row("segments copied", [b.segments_copied for b in report.brokers], size=False)
    row("remote reads", [b.remote_reads for b in report.brokers], size=False)
    brokers.caption = (
        "local tier: the topic's bytes on each broker's disk, every replica; remote tier: "
        "one copy, in the object store; reads: record bytes served to consumers "
        "(ConsumerBytesOut); segments copied and remote reads: the object store's requests "
        "(RemoteCopyRequestsPerSec, RemoteFetchRequestsPerSec)"
    )
    brokers.caption_justify = "left"

    reads = Table(title="reading from offset 0", title_justify="left")
    for column in ("reader", "records", "seconds"):
        reads.add_column(column, justify="right" if column != "reader" else "left")
    reads.add_row(
        f"consumer in rack {CLIENT_RACK}, via its rack's broker",
        str(report.rack_read_records),
        f"{report.rack_read_s:.2f}",
    )
    reads.add_row(
        f"TieredConsumer, the object store only ({human_size(report.direct_bytes)})",
        str(report.direct_records),
        f"{report.direct_s:.2f}",
    )
    return Group(brokers, reads)


def run(mib: float, directory: Path | None, console: Console) -> DemoReport:
    """The whole demo, in `directory` (a temp dir, removed after, if None)."""
    with tempfile.TemporaryDirectory(prefix="tierbroker-demo-") as scratch:
        where = directory or Path(scratch)
        where.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        demo = Demo(where, mib, console)
        with demo.running():
            report = demo.run()
        console.print(report_tables(report))
        console.print(f"done in {time.monotonic() - started:.1f} s")
        return report


def _sum(samples: list[Any], name: str, locality: str | None = None) -> float:
    return sum(
        float(s.value)
        for s in samples
        if s.name == name and (locality is None or s.labels.get("locality") == locality)
    )


def human_size(nbytes: float) -> str:
    if abs(nbytes) < 1024:
        return f"{nbytes:.0f} B"
    if abs(nbytes) < 1024 * 1024:
        return f"{nbytes / 1024:.0f} KiB"
    return f"{nbytes / 2**20:.1f} MiB"
