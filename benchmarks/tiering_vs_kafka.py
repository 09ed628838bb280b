"""Tiering side by side with Apache Kafka: copy rate and remote-read rate on the same data.

    python -m benchmarks.tiering_vs_kafka [--mib 64] [--rounds 2]

Both brokers keep their remote tier in a local directory (tierbroker's `localfs`, Kafka
with its own LocalTieredStorage and topic-based metadata manager), so
the comparison is of the brokers, not of an object store. Per broker and round, in ABBA
order: `--mib` MiB of 1 KiB values are produced into 8 MiB segments with copies held back
(`remote.log.copy.disable`), then released; the copy rate is the closed segments' bytes
over the time from the first remote byte to the last. Local retention then drops the
tiered segments and a lean Fetch client reads the partition from offset 0 to the local
log start, one Fetch in flight, twice (the faster pass counts). Broker CPU seconds per MB
are measured over each phase from /proc.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from benchmarks.targets import process_cpu_seconds, start_tierbroker, stop
from benchmarks.tiering import produce, read_through_broker
from tests.apache_kafka import ApacheKafka, tiered_storage
from tests.integration.tiering_helpers import EARLIEST_LOCAL, LATEST_TIERED, list_offsets

MIB = 1 << 20
TOPIC = "held"
TOPIC_CONFIG = {
    "segment.bytes": str(8 * MIB),
    "remote.storage.enable": "true",
    "remote.log.copy.disable": "true",
}
FAST = {"remote.log.manager.task.interval.ms": "200", "log.retention.check.interval.ms": "300"}


class Running:
    """A started broker: its bootstrap, process id, local partition dir and remote dir."""

    def __init__(
        self, bootstrap: str, pid: int, partition: Path, remote: Path, stop: Callable[[], None]
    ) -> None:
        self.bootstrap, self.pid, self.partition, self.remote = bootstrap, pid, partition, remote
        self.port = int(bootstrap.rsplit(":", 1)[1])
        self.stop = stop


def start(name: str, workdir: Path) -> Running:
    if name == "tierbroker":
        broker = start_tierbroker(workdir, FAST)
        data = workdir / "data"
        partition, remote = data / f"{TOPIC}-0", data / "remote"
        return Running(
            broker.bootstrap, broker.process.pid, partition, remote, lambda: stop(broker)
        )
    properties = {**tiered_storage(workdir), **FAST}
    kafka = ApacheKafka(workdir / "kafka", properties).start()
    assert kafka.process is not None
    partition = workdir / "kafka" / "data" / f"{TOPIC}-0"
    return Running(
        kafka.bootstrap_servers, kafka.process.pid, partition, workdir / "remote", kafka.stop
    )


def remote_log_bytes(remote: Path) -> int:
    return sum(p.stat().st_size for p in remote.rglob("*.log"))


def closed_segment_bytes(partition: Path) -> int:
    """The bytes of every segment but the active one (the highest base offset)."""
    logs = sorted(partition.glob("*.log"))
    return sum(p.stat().st_size for p in logs[:-1])


def alter(admin: AdminClient, key: str, value: str) -> None:
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", TOPIC, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(15)


def run(name: str, mib: int) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-tiering-{name}-"))
    broker = start(name, workdir)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config=TOPIC_CONFIG)])[TOPIC].result(30)
        produce(broker.bootstrap, TOPIC, mib)
        closed = closed_segment_bytes(broker.partition)
        alter(admin, "remote.log.copy.disable", "false")
        while (first := remote_log_bytes(broker.remote)) == 0:
            time.sleep(0.005)
        started, cpu = time.perf_counter(), process_cpu_seconds(broker.pid)
        while remote_log_bytes(broker.remote) < closed:
            time.sleep(0.01)
        copy_s = time.perf_counter() - started
        copy_cpu = process_cpu_seconds(broker.pid) - cpu
        copied_mb = (closed - first) / 1e6

        alter(admin, "local.retention.bytes", "1")

        def offsets() -> tuple[int, int]:
            local = list_offsets(broker.port, TOPIC, EARLIEST_LOCAL, version=10)[1]
            return local, list_offsets(broker.port, TOPIC, LATEST_TIERED, version=10)[1]

        while (o := offsets())[0] == 0 or o[1] + 1 != o[0]:
            time.sleep(0.1)
        best_s, read_mb, read_cpu = float("inf"), 0.0, 0.0
        for _ in range(2):
            cpu = process_cpu_seconds(broker.pid)
            seconds, read = read_through_broker(broker.port, TOPIC, o[0])
            if seconds < best_s:
                best_s, read_mb = seconds, read / 1e6
                read_cpu = process_cpu_seconds(broker.pid) - cpu
        return {
            "copy_mb_s": copied_mb / copy_s,
            "copy_cpu_s_per_mb": copy_cpu / copied_mb,
            "read_mb_s": read_mb / best_s,
            "read_cpu_s_per_mb": read_cpu / read_mb,
        }
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"tierbroker": [], "apache-kafka": []}
    for r in range(args.rounds):
        order = ("tierbroker", "apache-kafka") if r % 2 == 0 else ("apache-kafka", "tierbroker")
        for name in order:
            results[name].append(run(name, args.mib))
            print(name, {k: round(v, 4) for k, v in results[name][-1].items()}, flush=True)
    ours, theirs = results["tierbroker"], results["apache-kafka"]
    print(f"{'measure':24} {'tierbroker':>16} {'Apache Kafka':>16} {'ratio':>12}")
    for key in ("copy_mb_s", "copy_cpu_s_per_mb", "read_mb_s", "read_cpu_s_per_mb"):
        ratios = [a[key] / b[key] for a, b in zip(ours, theirs, strict=True)]
        columns = span([a[key] for a in ours]), span([b[key] for b in theirs]), span(ratios, 2)
        print(f"{key:24} {columns[0]:>16} {columns[1]:>16} {columns[2]:>12}")


def span(values: list[Any], digits: int = 3) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}g}" if low == high else f"{low:.{digits}g}-{high:.{digits}g}"


if __name__ == "__main__":
    main()
