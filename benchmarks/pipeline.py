"""Reading the remote tier without the broker, against reading it through the broker, in one run.

    python -m benchmarks.pipeline [--mib 128] [--value-size 1024] [--spark-cores 2]

One tierbroker tiers a 2-partition topic to LocalFs (8 MiB segments, local
retention 8 MiB), then the same remote range (offset 0 to the end of the remote
tier) is read three ways:

- backfill through the broker: `TieredConsumer` in KAFKA_ONLY (aiokafka);
- backfill from the object store: `TieredConsumer` in REMOTE_ONLY;
- Spark (`local[N]`) through the `tierbroker` source, summing value lengths;

and, for scale, the same Spark query over `benchmarks.spark_floor`, a source that
reads nothing and yields prebuilt Arrow batches of as many bytes: Spark's own
cost for a Python data source.

Reported: MB/s, the broker's and the reader's CPU seconds, and MB per CPU second
of every process involved. Per core, Spark is compared with the broker's fetch
path as the KAFKA_ONLY backfill uses it (broker plus its client: a Spark job
through the broker would add Spark's own work on top). Tiering happens before any
timing starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka.structs import TopicPartition
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.targets import (
    ROOT,
    Broker,
    free_port,
    process_cpu_seconds,
    start_tierbroker,
    stop,
)
from tierbroker.pipeline import TieredConsumer

MIB = 1 << 20
TOPIC = "backfill"
PARTITIONS = 2
OVERRIDES = {
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "300",
}
TOPIC_CONFIG = {
    "remote.storage.enable": "true",
    "segment.bytes": str(8 * MIB),
    "local.retention.bytes": str(8 * MIB),
}


def tier_status(metrics_port: str) -> dict[int, dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/tier/status", timeout=5) as r:
        return {row["partition"]: row for row in json.load(r) if row["topic"] == TOPIC}


def fill(broker: Broker, metrics_port: str, mib: int, value_size: int) -> dict[int, int]:
    """Produce `mib` MiB and wait until it is tiered; the remote end offset per partition."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=TOPIC_CONFIG)])[TOPIC].result(15)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.size": 262144}
    )
    value = os.urandom(value_size)
    for i in range(mib * MIB // value_size):
        while True:
            try:
                producer.produce(TOPIC, value, b"%d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(60) == 0
    deadline = time.monotonic() + 300
    while True:
        rows = tier_status(metrics_port)
        if len(rows) == PARTITIONS and all(
            r["copy_lag_segments"] == 0 and r["local_log_start_offset"] > 0 for r in rows.values()
        ):
            return {p: r["remote_log_end_offset"] + 1 for p, r in rows.items()}
        if time.monotonic() > deadline:
            raise SystemExit(f"not tiered after 300 s: {rows}")
        time.sleep(0.5)


async def backfill(broker: Broker, storage: str, mode: str, ends: dict[int, int]) -> int:
    """Read every partition from offset 0 to `ends`; the value bytes read."""
    consumer = TieredConsumer(
        mode=mode,
        storage=storage,
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * MIB,
        fetch_max_bytes=16 * MIB,
    )
    await consumer.start()
    read = 0
    try:
        tps = {TopicPartition(TOPIC, p): end for p, end in ends.items()}
        consumer.assign(list(tps))
        await consumer.seek_to_beginning(*tps)
        left = dict(tps)
        while left:
            for tp, records in (
                await consumer.getmany(timeout_ms=1000, max_records=10_000)
            ).items():
                for r in records:
                    if r.offset < tps[tp]:
                        read += len(r.value or b"")
                if tp in left and await consumer.position(tp) >= tps[tp]:
                    del left[tp]
    finally:
        await consumer.stop()
    return read


def measure(broker: Broker, label: str, run: Any) -> dict[str, float]:
    broker_cpu, reader_cpu, started = broker.cpu_seconds(), time.process_time(), time.monotonic()
    read = run()
    seconds = time.monotonic() - started
    result = {
        "mb": read / 1e6,
        "seconds": seconds,
        "broker_cpu_s": broker.cpu_seconds() - broker_cpu,
        "reader_cpu_s": time.process_time() - reader_cpu,
    }
    result["mb_per_s"] = result["mb"] / seconds
    result["mb_per_cpu_s"] = result["mb"] / (result["broker_cpu_s"] + result["reader_cpu_s"])
    print(
        f"{label:<28} {result['mb_per_s']:8.1f} MB/s  broker {result['broker_cpu_s']:6.2f} CPU s"
        f"  reader {result['reader_cpu_s']:6.2f} CPU s  {result['mb_per_cpu_s']:7.1f} MB/CPU s",
        flush=True,
    )
    return result


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of `root` and every live descendant (the JVM and its Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        try:
            total += process_cpu_seconds(pid)
        except (OSError, ValueError):
            continue
        stack += children.get(pid, [])
    return total


def spark_read(
    storage: str, ends: dict[int, int], cores: int, value_size: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Spark reading the tier through the `tierbroker` source, then the floor source
    (`benchmarks.spark_floor`, which reads nothing) for as many bytes, each timed
    after a warm-up run of the same query."""
    from pyspark.sql import DataFrame, SparkSession

    from benchmarks.spark_floor import FloorDataSource
    from tierbroker.pipeline.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("tierbroker-bench")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(FloorDataSource)
    jvm = spark.sparkContext._jvm.ProcessHandle.current().pid()  # type: ignore[union-attr]
    ending = json.dumps({TOPIC: {str(p): end for p, end in ends.items()}})

    def timed(label: str, frame: Callable[[], DataFrame]) -> dict[str, float]:
        def query() -> tuple[int, int]:
            read, rows = frame().selectExpr("sum(length(value))", "count(*)").collect()[0]
            return int(read), int(rows)

        query()  # warm-up: JVM code paths and Python workers started
        cpu, started = tree_cpu_seconds(jvm) + time.process_time(), time.monotonic()
        read, rows = query()
        seconds = time.monotonic() - started
        cpu_s = tree_cpu_seconds(jvm) + time.process_time() - cpu
        result = {"mb": read / 1e6, "rows": rows, "seconds": seconds, "spark_cpu_s": cpu_s}
        result["mb_per_s"] = result["mb"] / seconds
        result["mb_per_cpu_s"] = result["mb"] / cpu_s
        print(
            f"{label:<28} {result['mb_per_s']:8.1f} MB/s  broker   0.00 CPU s"
            f"  spark {cpu_s:7.2f} CPU s  {result['mb_per_cpu_s']:7.1f} MB/CPU s",
            flush=True,
        )
        return result

    try:
        tier = timed(
            f"Spark local[{cores}] from the tier",
            lambda: (
                spark.read.format("tierbroker")
                .options(storage=storage, topic=TOPIC, endingOffsets=ending)
                .load()
            ),
        )
        assert tier["rows"] == sum(ends.values()), (tier, ends)
        floor = timed(
            "Spark floor (reads nothing)",
            lambda: (
                spark.read.format("tierbroker-floor")
                .options(bytes=str(int(tier["mb"] * 1e6)), valueSize=str(value_size))
                .load()
            ),
        )
    finally:
        spark.stop()
    return tier, floor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline")
    parser.add_argument("--mib", type=int, default=128, help="MiB of values produced")
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--spark-cores", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tierbroker-pipeline-") as tmp:
        workdir = Path(tmp)
        metrics_port = str(free_port())
        broker = start_tierbroker(workdir, {**OVERRIDES, "metrics.port": metrics_port})
        try:
            ends = fill(broker, metrics_port, args.mib, args.value_size)
            storage = (workdir / "data" / "remote").as_uri()
            print(f"remote tier: {sum(ends.values())} records in {TOPIC}", flush=True)
            results = {
                "kafka_only": measure(
                    broker,
                    "backfill KAFKA_ONLY",
                    lambda: asyncio.run(backfill(broker, storage, "KAFKA_ONLY", ends)),
                ),
                "remote_only": measure(
                    broker,
                    "backfill REMOTE_ONLY",
                    lambda: asyncio.run(backfill(broker, storage, "REMOTE_ONLY", ends)),
                ),
            }
            results["spark"], results["spark_floor"] = spark_read(
                storage, ends, args.spark_cores, args.value_size
            )
        finally:
            stop(broker)
    kafka, remote, spark = results["kafka_only"], results["remote_only"], results["spark"]
    ratios = {
        "remote_only_vs_kafka_only_mb_per_s": remote["mb_per_s"] / kafka["mb_per_s"],
        "spark_vs_broker_path_mb_per_cpu_s": spark["mb_per_cpu_s"] / kafka["mb_per_cpu_s"],
        "spark_floor_vs_broker_path_mb_per_cpu_s": (
            results["spark_floor"]["mb_per_cpu_s"] / kafka["mb_per_cpu_s"]
        ),
    }
    print(
        f"REMOTE_ONLY / KAFKA_ONLY: {ratios['remote_only_vs_kafka_only_mb_per_s']:.2f}x MB/s, "
        f"broker CPU {remote['broker_cpu_s']:.2f} s vs {kafka['broker_cpu_s']:.2f} s\n"
        f"Spark / broker path, MB per CPU second: "
        f"{ratios['spark_vs_broker_path_mb_per_cpu_s']:.2f}x "
        f"(a source reading nothing: {ratios['spark_floor_vs_broker_path_mb_per_cpu_s']:.2f}x)",
        flush=True,
    )
    if args.json:
        args.json.write_text(json.dumps({**results, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
