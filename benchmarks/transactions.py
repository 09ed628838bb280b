"""Transactions: what they cost a producer, a consumer and a record's way through, on
tierbroker and on Apache Kafka, each measured in the same run.

    .venv/bin/python -m benchmarks.transactions [--messages N] [--size B] [--repeat R]
                                                [--targets tierbroker,apache-kafka]

Per broker, with confluent-kafka (acks=all, linger.ms=5, batch.size 1 MB):
- produce: idempotent; idempotent flushed every 1,000 records (a commit makes the
  client drain its pipeline: the floor of the next); transactional committing every
  1,000 records and every 100 ms (the goal: at least 0.9x the idempotent MB/s);
- consume the transactional topic read_committed and read_uncommitted (goal: at least
  0.95x);
- end-to-end: from begin_transaction to a read_committed consumer's receipt of the
  committed record, one record per transaction, median and p99 of `--latencies`;
- the produce modes again with Kafka's Java client (benchmarks/java), whose
  transactions v2 send no AddPartitionsToTxn: the broker's share of a transaction's
  round without librdkafka's.
The median of `--repeat` runs counts; ratios are within one broker, then across.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from benchmarks import workload
from benchmarks.phase import Phase
from benchmarks.targets import TargetUnavailable, running
from tests.apache_kafka import run_java

MODES = {"idempotent": None, "flush-1000": "flush", "every-1000": "records", "every-100ms": "time"}
JAVA_PRODUCER = Path(__file__).parent / "java" / "TransactionalProduce.java"
JIT = ("-Xmx1g",)  # the JVM's full compiler: this is a throughput run
PRODUCER = {"acks": "all", "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none"}


def produce(bootstrap: str, topic: str, value: bytes, count: int, commit: str | None) -> Phase:
    """`count` records; `commit`: None (idempotent), "flush" (idempotent, flushed every
    1,000: the drain a commit makes the client do, without a transaction), "records"
    (transactions of 1,000) or "time" (of 100 ms). Timed from the first produce to the
    last acknowledgement."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, **PRODUCER}
    if commit in (None, "flush"):
        config["enable.idempotence"] = True
    else:
        config["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    producer = Producer(config)
    producer.list_topics(topic, timeout=10)
    transactional = commit in ("records", "time")
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    started = time.perf_counter()
    last_commit = started
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.001)
        if i % 1000 == 999:  # serve delivery reports, as an application does; left to
            producer.poll(0)  # pile up, they slow librdkafka's producer down several times
        if (commit == "records" and (i + 1) % 1000 == 0) or (
            commit == "time" and time.perf_counter() - last_commit >= 0.1
        ):
            producer.commit_transaction(30)
            producer.begin_transaction()
            last_commit = time.perf_counter()
    if not transactional:
        if producer.flush(60):
            raise RuntimeError("records still undelivered after 60 s")
    else:
        producer.commit_transaction(60)
    return Phase(count, count * len(value), time.perf_counter() - started)


def consume(bootstrap: str, topic: str, count: int, isolation: str) -> Phase:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **workload.CONSUMER_SETTINGS,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
        }
    )
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages = payload = 0
        deadline = time.monotonic() + 120
        while messages < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read {messages} of {count} records in 120 s")
            for message in consumer.consume(min(10_000, count - messages), 1.0):
                if message.error() is not None:
                    raise KafkaException(message.error())
                messages += 1
                payload += len(message)
        return Phase(messages, payload, time.perf_counter() - started)
    finally:
        consumer.close()


def latencies(bootstrap: str, topic: str, rounds: int) -> list[float]:
    """Seconds from begin_transaction to a read_committed consumer's receipt, per record."""
    received: dict[bytes, float] = {}
    stop = threading.Event()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
            "auto.offset.reset": "latest",
        }
    )
    consumer.assign([TopicPartition(topic, 0, -1)])  # the end: only what comes next

    def read() -> None:
        while not stop.is_set():
            for message in consumer.consume(1, 0.05):  # returns as soon as one is there
                if message.error() is None:
                    received[message.value()] = time.perf_counter()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    time.sleep(1.0)  # the consumer's position is at the end
    took = []
    try:
        for i in range(rounds):
            key = b"latency-%d" % i
            started = time.perf_counter()
            producer.begin_transaction()
            producer.produce(topic, key)
            producer.commit_transaction(30)
            deadline = time.monotonic() + 10
            while key not in received and time.monotonic() < deadline:
                time.sleep(0.0005)
            if key in received:
                took.append(received[key] - started)
    finally:
        stop.set()
        reader.join(5)
        consumer.close()
    return took


def java_produce(bootstrap: str, args: argparse.Namespace) -> dict[str, float]:
    """MiB/s per produce mode with the Java client: the median of the rounds after the
    first, which warms the JVM up."""
    printed = run_java(
        JAVA_PRODUCER,
        bootstrap,
        str(args.messages),
        str(args.size),
        str(args.repeat + 1),
        timeout_s=1800,
        options=JIT,
    )
    rates: dict[str, list[float]] = {}
    for line in printed.splitlines():
        round_, mode, rate = line.split()
        if int(round_) > 0:
            rates.setdefault(mode, []).append(float(rate))
    return {mode: statistics.median(r) for mode, r in rates.items()}


def median(runs: list[Phase]) -> Phase:
    return sorted(runs, key=lambda p: p.seconds)[len(runs) // 2]


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    value = b"x" * args.size
    result: dict[str, Any] = {}
    with running(name) as broker:
        bootstrap = broker.bootstrap
        for mode, commit in MODES.items():
            runs = []
            for _ in range(args.repeat):
                topic = f"txn-{mode}-{uuid.uuid4().hex[:6]}"
                workload.create_topic(bootstrap, topic)
                runs.append(produce(bootstrap, topic, value, args.messages, commit))
                if mode == "every-1000":  # each isolation first in turn: the same warm cache
                    isolations = ["read_uncommitted", "read_committed"]
                    for isolation in isolations[:: 1 if len(runs) % 2 else -1]:
                        phase = consume(bootstrap, topic, args.messages, isolation)
                        result.setdefault(isolation, []).append(phase)
            result[mode] = median(runs)
            print(f"  {name} produce {mode}: {result[mode].mib_per_s:.1f} MiB/s")
        for isolation in ("read_uncommitted", "read_committed"):
            result[isolation] = median(result[isolation])
            print(f"  {name} consume {isolation}: {result[isolation].mib_per_s:.1f} MiB/s")
        topic = f"txn-latency-{uuid.uuid4().hex[:6]}"
        workload.create_topic(bootstrap, topic)
        took = sorted(latencies(bootstrap, topic, args.latencies))
        result["latency_ms"] = (
            1000 * statistics.median(took),
            1000 * took[min(len(took) - 1, int(len(took) * 0.99))],
            len(took),
        )
        print(f"  {name} end-to-end: median {result['latency_ms'][0]:.1f} ms")
        result["java"] = java_produce(bootstrap, args)
        print(f"  {name} Java client: {result['java']}")
    return result


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"{args.messages} records of {args.size} B per run, median of {args.repeat}; "
        "confluent-kafka, acks=all, linger.ms=5",
        f"{'':<14}{'idempotent':>11}{'flush/1000':>11}{'txn/1000':>10}{'txn/100ms':>10}"
        f"{'read unc.':>11}{'read com.':>11}{'e2e ms p50/p99':>16}",
    ]
    for name, r in results.items():
        idem, flushed, t1000, t100 = (r[m].mib_per_s for m in MODES)
        ru, rc = r["read_uncommitted"].mib_per_s, r["read_committed"].mib_per_s
        p50, p99, _ = r["latency_ms"]
        lines.append(
            f"{name:<14}{idem:>11.1f}{flushed:>11.1f}{t1000:>10.1f}{t100:>10.1f}"
            f"{ru:>11.1f}{rc:>11.1f}{p50:>9.1f}/{p99:<6.1f}"
        )
        lines.append(
            f"{'  ratios':<14}txn/100ms / idempotent {t100 / idem:.2f}x, txn/1000 / flush/1000 "
            f"{t1000 / flushed:.2f}x, read committed / uncommitted {rc / ru:.2f}x"
        )
        java = r["java"]
        lines.append(
            f"{'  Java client':<14}"
            + "".join(
                f"{java[m]:>11.1f}" if i < 2 else f"{java[m]:>10.1f}" for i, m in enumerate(MODES)
            )
            + f"   txn/100ms / idempotent {java['every-100ms'] / java['idempotent']:.2f}x, "
            f"txn/1000 / idempotent {java['every-1000'] / java['idempotent']:.2f}x"
        )
    if {"tierbroker", "apache-kafka"} <= results.keys():
        mine, theirs = results["tierbroker"], results["apache-kafka"]
        lines.append(
            "tierbroker/apache-kafka: "
            + ", ".join(
                f"{m} {mine[m].mib_per_s / theirs[m].mib_per_s:.2f}x"
                for m in (*MODES, "read_committed")
            )
            + f", e2e median {mine['latency_ms'][0] / theirs['latency_ms'][0]:.2f}x"
        )
    lines.append(
        "MiB/s of payload; flush/1000: idempotent, flushed every 1,000 records (a commit "
        "drains the client's pipeline too)"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latencies", type=int, default=200)
    parser.add_argument("--targets", default="tierbroker,apache-kafka")
    args = parser.parse_args()
    results = {}
    for name in args.targets.split(","):
        try:
            results[name] = run(name, args)
        except TargetUnavailable as e:
            print(f"{name}: skipped: {e}")
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
