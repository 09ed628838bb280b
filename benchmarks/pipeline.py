"""Reading the remote tier without the broker, against reading it through the broker, in one run.

    python -m benchmarks.pipeline [--mib 128] [--value-size 1024] [--spark-cores 2] [--rounds 5]

One tierbroker tiers a 2-partition topic to LocalFs (8 MiB segments, local
retention 8 MiB), then the same offsets (0 to the end of the remote tier) are read:

- as a backfill through the broker: `TieredConsumer` in KAFKA_ONLY (aiokafka);
- as a backfill from the object store: `TieredConsumer` in REMOTE_ONLY;
- by Spark (`local[N]`, `sum(length(value))` and `count(*)`), five ways, in one
  session: the `tierbroker` source; Spark's own Kafka source (`spark-sql-kafka-0-10`,
  the jars `make peers` fetches) through tierbroker, and through Apache Kafka holding
  the same rows (produced alike, one KRaft node beside it); a source that reads
  nothing, with the `tierbroker` source's very input partitioning
  (`benchmarks.spark_floor`: Spark's own cost); Spark's native Parquet reader over
  the same rows, written once beforehand.

The Spark variants run interleaved: a warm-up round (not counted, it compiles
Spark's code paths and starts the Python workers), then `--rounds` rounds, each
running every variant once, the order rotating. Reported per variant: medians of
MB/s, CPU seconds of Spark (the JVM and all its descendants, the driver) and of
the broker, and MB per CPU second of them all; and the median, lowest and
highest of the per-round ratios. Tiering happens before any timing starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
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
from tests.apache_kafka import ApacheKafka
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


def produce(bootstrap: str, mib: int, value_size: int, config: dict[str, str]) -> None:
    """`mib` MiB of distinct values to TOPIC, created with `config`: the same records at
    the same offsets on any broker."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=config)])[TOPIC].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 262144})
    # Distinct values (an index, then random bytes from a random place), so that no
    # reader gets them cheaper by compressing or dictionary-encoding repeats.
    noise = os.urandom(8 * MIB)
    for i in range(mib * MIB // value_size):
        at = (i * 7919) % (len(noise) - value_size)
        value = i.to_bytes(8, "big") + noise[at : at + value_size - 8]
        while True:
            try:
                producer.produce(TOPIC, value, b"%d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(60) == 0


def fill(broker: Broker, metrics_port: str, mib: int, value_size: int) -> dict[int, int]:
    """Produce `mib` MiB and wait until it is tiered; the remote end offset per partition."""
    produce(broker.bootstrap, mib, value_size, TOPIC_CONFIG)
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
    """CPU seconds of `root` and every live descendant (the JVM and its Python workers),
    reaped children included."""
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


SPARK_VARIANTS = ("tierbroker", "kafka_source", "kafka_source_apache", "floor", "parquet")
LABELS = {
    "tierbroker": "Spark, `tierbroker` source",
    "kafka_source": "Spark's Kafka source, tierbroker",
    "kafka_source_apache": "Spark's Kafka source, Apache Kafka",
    "floor": "Spark, a source that reads nothing",
    "parquet": "Spark, native Parquet reader",
}


def median(values: list[float]) -> float:
    return statistics.median(values)


def spark_rounds(
    brokers: tuple[Broker, ApacheKafka],
    storage: str,
    ends: dict[int, int],
    args: argparse.Namespace,
    workdir: Path,
) -> dict[str, Any]:
    """The Spark variants, interleaved: a warm-up round, then `args.rounds` timed rounds,
    each running every variant once (the order rotating from round to round)."""
    from pyspark.sql import DataFrame, SparkSession

    from benchmarks.spark_floor import FloorDataSource
    from tests.spark_kafka import kafka_source_jars, read_kafka
    from tierbroker.pipeline.spark import register
    from tierbroker.pipeline.spark.options import ReadOptions
    from tierbroker.pipeline.spark.plan import plan

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    spark = (
        SparkSession.builder.master(f"local[{args.spark_cores}]")
        .appName("tierbroker-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars", kafka_source_jars())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(FloorDataSource)
    broker, kafka = brokers
    assert kafka.process is not None
    jvm = spark.sparkContext._jvm.ProcessHandle.current().pid()  # type: ignore[union-attr]
    ending = json.dumps({TOPIC: {str(p): end for p, end in ends.items()}})
    options = {"storage": storage, "subscribe": TOPIC, "endingOffsets": ending}
    tasks = len(plan(ReadOptions.parse(options)))
    parquet = str(workdir / "parquet")
    spark.read.format("tierbroker").options(**options).load().write.parquet(parquet)

    frames: dict[str, Callable[[], DataFrame]] = {
        "tierbroker": lambda: spark.read.format("tierbroker").options(**options).load(),
        "kafka_source": lambda: read_kafka(spark, broker.bootstrap, TOPIC, ends),
        "kafka_source_apache": lambda: read_kafka(spark, kafka.bootstrap_servers, TOPIC, ends),
        "floor": lambda: (
            spark.read.format("tierbroker-floor")
            .options(
                rows=str(sum(ends.values())),
                valueSize=str(args.value_size),
                partitions=str(tasks),
            )
            .load()
        ),
        "parquet": lambda: spark.read.parquet(parquet),
    }

    def brokers_cpu() -> float:
        return broker.cpu_seconds() + process_cpu_seconds(kafka.process.pid)  # type: ignore[union-attr]

    def timed(name: str) -> dict[str, float]:
        broker_cpu = brokers_cpu()
        cpu, started = tree_cpu_seconds(jvm) + time.process_time(), time.monotonic()
        read, rows = frames[name]().selectExpr("sum(length(value))", "count(*)").collect()[0]
        seconds = time.monotonic() - started
        spark_cpu = tree_cpu_seconds(jvm) + time.process_time() - cpu
        broker_cpu = brokers_cpu() - broker_cpu
        assert rows == sum(ends.values()), (name, rows, ends)
        return {
            "mb": read / 1e6,
            "seconds": seconds,
            "spark_cpu_s": spark_cpu,
            "broker_cpu_s": broker_cpu,
            "mb_per_s": read / 1e6 / seconds,
            "mb_per_cpu_s": read / 1e6 / (spark_cpu + broker_cpu),
        }

    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for number in range(args.rounds + 1):
            shift = number % len(SPARK_VARIANTS)
            order = SPARK_VARIANTS[shift:] + SPARK_VARIANTS[:shift]
            results = {name: timed(name) for name in order}
            label = "warm-up" if number == 0 else f"round {number}"
            print(
                f"{label}: "
                + ", ".join(f"{n} {results[n]['mb_per_cpu_s']:.0f}" for n in SPARK_VARIANTS)
                + " MB/CPU s",
                flush=True,
            )
            if number:
                rounds.append(results)
    finally:
        spark.stop()

    summary: dict[str, Any] = {"input_partitions": tasks, "rounds": rounds}
    for name in SPARK_VARIANTS:
        summary[name] = {key: median([r[name][key] for r in rounds]) for key in rounds[0][name]}

    def ratios(numerator: str, denominator: str) -> list[float]:
        return [r[numerator]["mb_per_cpu_s"] / r[denominator]["mb_per_cpu_s"] for r in rounds]

    summary["ratios"] = {
        f"{a}_vs_{b}": {"median": median(values), "min": min(values), "max": max(values)}
        for a, b in (
            ("tierbroker", "kafka_source_apache"),
            ("tierbroker", "kafka_source"),
            ("kafka_source", "kafka_source_apache"),
            ("tierbroker", "floor"),
            ("parquet", "kafka_source_apache"),
        )
        for values in [ratios(a, b)]
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline")
    parser.add_argument("--mib", type=int, default=128, help="MiB of values produced")
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--spark-cores", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timed Spark rounds")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tierbroker-pipeline-") as tmp:
        workdir = Path(tmp)
        metrics_port = str(free_port())
        broker = start_tierbroker(workdir, {**OVERRIDES, "metrics.port": metrics_port})
        kafka = ApacheKafka(workdir / "apache-kafka").start()
        try:
            ends = fill(broker, metrics_port, args.mib, args.value_size)
            produce(kafka.bootstrap_servers, args.mib, args.value_size, {})
            storage = (workdir / "data" / "remote").as_uri()
            print(f"remote tier: {sum(ends.values())} records in {TOPIC}", flush=True)
            results: dict[str, Any] = {
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
            results["spark"] = spark_rounds((broker, kafka), storage, ends, args, workdir)
        finally:
            stop(broker)
            kafka.stop()
    kafka, remote, spark = results["kafka_only"], results["remote_only"], results["spark"]
    print(
        f"Spark local[{args.spark_cores}], {spark['input_partitions']} input partitions of "
        f"the tierbroker source, medians of {args.rounds} rounds:",
        flush=True,
    )
    for name in SPARK_VARIANTS:
        row = spark[name]
        print(
            f"  {LABELS[name]:<38} {row['mb_per_s']:7.1f} MB/s  spark {row['spark_cpu_s']:5.2f}"
            f" CPU s  brokers {row['broker_cpu_s']:5.2f} CPU s"
            f"  {row['mb_per_cpu_s']:6.1f} MB/CPU s",
            flush=True,
        )
    for name, ratio in spark["ratios"].items():
        print(
            f"  {name}: {ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})",
            flush=True,
        )
    print(
        "REMOTE_ONLY / KAFKA_ONLY: "
        f"{remote['mb_per_s'] / kafka['mb_per_s']:.2f}x MB/s, "
        f"broker CPU {remote['broker_cpu_s']:.2f} s vs {kafka['broker_cpu_s']:.2f} s",
        flush=True,
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
