"""tierbroker against Apache Kafka, side by side in one run: produce and consume MiB/s,
broker CPU seconds per MiB, start-up to the first ApiVersions answer, resident memory.

    .venv/bin/python -m benchmarks.versus_kafka                      # about 4 minutes on 2 cores
    .venv/bin/python -m benchmarks.versus_kafka --mib 32 --rounds 1 --starts 1   # quick check
    .venv/bin/python -m benchmarks.versus_kafka --plain-install --rounds 5      # as users run it

With `--plain-install` tierbroker runs from a fresh `pip install` of this tree in a
virtualenv (as `benchmarks.startup` builds it): this environment's kio also imports
hypothesis, which slows the start.

Both brokers start `--starts` times in turn (tierbroker first); each start gives its
start-up and, `--idle-s` later, its resident memory at idle (VmRSS summed over the
process and its descendants: for Kafka the JVM). The last start of each stays up for
the load: an untimed warm-up round on each (the JVM's JIT), then `--rounds` rounds in
ABBA order (tierbroker first in odd rounds, Kafka first in even ones). A round, per value
size, runs two loads, each on a fresh topic of 1 partition, replication factor 1:
`librdkafka` (the
workload of `benchmarks.throughput`: confluent-kafka, acks=1, timed produce then
consume) and `perf-test` (Kafka's kafka-producer-perf-test / kafka-consumer-perf-test,
run as their classes, with the same producer settings; their own MB/sec, and for the
consumer its fetch rate, without the group join). Broker CPU is read from /proc around
each phase; resident memory under load is the largest sum sampled every 100 ms during
the rounds. Reported: medians per broker, and per round the ratios tierbroker / Kafka
(MiB/s, CPU s per MiB, start-up, RSS), median and lowest to highest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import string
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks import targets, workload
from benchmarks.phase import Phase
from benchmarks.startup import plain_install
from benchmarks.targets import KAFKA_JVM_OPTIONS, STARTERS, Broker, stop
from tests.apache_kafka import run_tool

NAMES = ("tierbroker", "apache-kafka")
# A load generator runs long enough for the JIT's top tier; it must not be the bottleneck.
TOOL_JVM = ("-Xmx1g",)
TOOL_PRODUCER = [f"{k}={v}" for k, v in workload.PRODUCER_SETTINGS.items() if "stat" not in k]
TOOL_CONSUMER = [
    f"{k}={v}" for k, v in workload.CONSUMER_SETTINGS.items() if "fetch" in k and "queue" not in k
]

Sample = dict[str, float]  # "mib_per_s", "cpu_s_per_mib" of one phase


def payload_file(directory: Path, size: int) -> Path:
    """64 distinct values of `size` bytes, one a line: kafka-producer-perf-test's
    `--record-size` refills every value with java.util.Random, byte by byte, which bounds
    the tool to tens of MB/s here; from a file it picks one of these at random."""
    path = directory / f"payloads-{size}.txt"
    if not path.exists():
        alphabet = string.ascii_letters.encode()
        lines = (bytes(alphabet[b % len(alphabet)] for b in os.urandom(size)) for _ in range(64))
        path.write_bytes(b"\n".join(lines))
    return path


def perf_produce(broker: Broker, topic: str, size: int, count: int) -> Sample:
    cpu = broker.cpu_seconds()
    out = run_tool(
        "ProducerPerformance", "--bootstrap-server", broker.bootstrap, "--topic", topic,
        "--num-records", str(count), "--payload-file", str(payload_file(broker.workdir, size)),
        "--throughput", "-1",
        "--command-property", *TOOL_PRODUCER,
        timeout_s=300, options=TOOL_JVM,
    )  # fmt: skip
    cpu = broker.cpu_seconds() - cpu
    found = re.findall(r"(\d+) records sent, [\d.]+ records/sec \(([\d.]+) MB/sec\)", out)
    if not found or int(found[-1][0]) != count:
        raise RuntimeError(f"kafka-producer-perf-test did not send {count} records:\n{out}")
    return {"mib_per_s": float(found[-1][1]), "cpu_s_per_mib": cpu / (count * size / 2**20)}


def perf_consume(broker: Broker, topic: str, size: int, count: int) -> Sample:
    properties = [arg for prop in TOOL_CONSUMER for arg in ("--command-property", prop)]
    cpu = broker.cpu_seconds()
    out = run_tool(
        "ConsumerPerformance", "--bootstrap-server", broker.bootstrap, "--topic", topic,
        "--num-records", str(count), "--group", f"perf-{topic}", *properties,
        "--fetch-size", str(workload.CONSUMER_SETTINGS["max.partition.fetch.bytes"]),
        timeout_s=300, options=TOOL_JVM,
    )  # fmt: skip
    cpu = broker.cpu_seconds() - cpu
    header, row = out.strip().splitlines()[-2:]
    fields = dict(zip((h.strip() for h in header.split(",")), row.split(","), strict=True))
    if int(fields["data.consumed.in.nMsg"]) < count:
        raise RuntimeError(f"kafka-consumer-perf-test read too few records:\n{out}")
    # fetch.MB.sec: the rate after the group join, as librdkafka's assign() has none
    return {
        "mib_per_s": float(fields["fetch.MB.sec"]),
        "cpu_s_per_mib": cpu / (count * size / 2**20),
    }


def sample(phase: Phase) -> Sample:
    assert phase.broker_cpu_s is not None
    return {
        "mib_per_s": phase.mib_per_s,
        "cpu_s_per_mib": phase.broker_cpu_s / (phase.payload_bytes / 2**20),
    }


def run_round(broker: Broker, tag: str, values: dict[int, bytes], mib: int) -> dict[str, Sample]:
    """Every size and load once against `broker`: "size load phase" -> sample."""
    samples: dict[str, Sample] = {}
    for size, value in values.items():
        count = max(1, mib * 2**20 // size)
        topic = f"rdk-{size}-{tag}"
        workload.create_topic(broker.bootstrap, topic)
        cpu = broker.cpu_seconds
        samples[f"{size} librdkafka produce"] = sample(
            workload.produce(broker.bootstrap, topic, value, count, cpu)
        )
        samples[f"{size} librdkafka consume"] = sample(
            workload.consume(broker.bootstrap, topic, count, size, cpu)
        )
        topic = f"perf-{size}-{tag}"
        workload.create_topic(broker.bootstrap, topic)
        samples[f"{size} perf-test produce"] = perf_produce(broker, topic, size, count)
        samples[f"{size} perf-test consume"] = perf_consume(broker, topic, size, count)
    return samples


@contextmanager
def rss_peak(broker: Broker) -> Iterator[list[float]]:
    """The largest resident memory of `broker`'s process tree, sampled every 100 ms."""
    peak = [broker.tree_rss_mib()]
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.1):
            peak[0] = max(peak[0], broker.tree_rss_mib())

    sampler = threading.Thread(target=poll, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


def start(name: str, workdir: Path, idle_s: float) -> tuple[Broker, dict[str, float]]:
    workdir.mkdir()
    broker = STARTERS[name](workdir)
    time.sleep(idle_s)  # idle means: nothing asked of it since it first answered
    return broker, {"startup_s": broker.startup_s, "idle_rss_mib": broker.tree_rss_mib()}


def ratios(ours: list[Sample], kafka: list[Sample], measure: str) -> list[float]:
    """Per round, ours / Kafka's; a round where Kafka's is 0 (no CPU tick in a short
    phase) has no ratio."""
    pairs = zip(ours, kafka, strict=True)
    return [a[measure] / b[measure] for a, b in pairs if b[measure] > 0]


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def report(starts: dict[str, list[dict[str, float]]], rounds: dict[str, list[dict[str, Sample]]],
           peaks: dict[str, float]) -> list[str]:  # fmt: skip
    lines = ["", "start-up and memory (median over starts; ratios per start pair)"]
    for key, label in (("startup_s", "start-up s"), ("idle_rss_mib", "idle RSS MiB")):
        mine = [s[key] for s in starts["tierbroker"]]
        theirs = [s[key] for s in starts["apache-kafka"]]
        per_start = [a / b for a, b in zip(mine, theirs, strict=False)]
        lines.append(
            f"  {label:<20} tierbroker {statistics.median(mine):8.2f}  apache-kafka "
            f"{statistics.median(theirs):8.2f}  ratio {spread(per_start)}"
        )
    lines.append(
        f"  {'RSS under load MiB':<20} tierbroker {peaks['tierbroker']:8.1f}  apache-kafka "
        f"{peaks['apache-kafka']:8.1f}  ratio {peaks['tierbroker'] / peaks['apache-kafka']:.2f}x"
    )
    lines += [
        "",
        f"{'':<26}{'MiB/s':>18}{'broker CPU s/MiB':>22}   tierbroker/kafka: MiB/s, CPU s/MiB",
    ]
    lines.append(f"{'':<26}{'tierbroker':>10}{'kafka':>8}{'tierbroker':>12}{'kafka':>10}")
    for key in rounds["tierbroker"][0]:
        ours = [r[key] for r in rounds["tierbroker"]]
        kafka = [r[key] for r in rounds["apache-kafka"]]
        med = {
            m: [statistics.median(s[m] for s in side) for side in (ours, kafka)]
            for m in ("mib_per_s", "cpu_s_per_mib")
        }
        rate, cpu = (ratios(ours, kafka, m) for m in ("mib_per_s", "cpu_s_per_mib"))
        lines.append(
            f"{key:<26}{med['mib_per_s'][0]:>10.1f}{med['mib_per_s'][1]:>8.1f}"
            f"{med['cpu_s_per_mib'][0]:>12.4f}{med['cpu_s_per_mib'][1]:>10.4f}   "
            f"{spread(rate)}, {spread(cpu)}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128, help="MiB of values per size and load")
    parser.add_argument("--sizes", default="1024,16384")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds after the warm-up")
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--plain-install",
        action="store_true",
        help="run tierbroker from a fresh `pip install` of this tree (as benchmarks.startup)",
    )
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C does, so the `finally`s stop every broker started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    values = {int(s): os.urandom(int(s)) for s in args.sizes.split(",")}
    workdir = Path(tempfile.mkdtemp(prefix="bench-versus-kafka-"))
    brokers: dict[str, Broker] = {}
    try:
        if args.plain_install:
            command = str(plain_install(workdir))
            targets.tierbroker_command = lambda: command  # the harness starts what it names
        starts: dict[str, list[dict[str, float]]] = {name: [] for name in NAMES}
        for i in range(args.starts):
            for name in NAMES:
                broker, measured = start(name, workdir / f"{name}-{i}", args.idle_s)
                starts[name].append(measured)
                print(f"start {i + 1} {name}: {measured}", flush=True)
                if i + 1 < args.starts:
                    stop(broker)
                else:
                    brokers[name] = broker
        rounds: dict[str, list[dict[str, Sample]]] = {name: [] for name in NAMES}
        peaks = dict.fromkeys(NAMES, 0.0)
        for round_ in range(args.rounds + 1):  # round 0: the warm-up
            # ABBA: whoever runs second in a round finds the client's process warmer.
            for name in NAMES if round_ % 2 else NAMES[::-1]:
                with rss_peak(brokers[name]) as peak:
                    samples = run_round(brokers[name], str(round_), values, args.mib)
                if round_ > 0:
                    rounds[name].append(samples)
                    peaks[name] = max(peaks[name], peak[0])
                shown = ", ".join(f"{k} {v['mib_per_s']:.0f}" for k, v in samples.items())
                print(
                    f"round {round_}{' (warm-up)' if round_ == 0 else ''} {name}: {shown}",
                    flush=True,
                )
    finally:
        for broker in brokers.values():
            stop(broker)
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\n{args.mib} MiB per size and load, {args.rounds} rounds after a warm-up; tierbroker "
        f"from {'a plain install' if args.plain_install else 'this environment'}; "
        f"Apache Kafka's JVM: {' '.join(KAFKA_JVM_OPTIONS)}"
    )
    print("\n".join(report(starts, rounds, peaks)))
    if args.json:
        args.json.write_text(
            json.dumps({"starts": starts, "rounds": rounds, "peaks": peaks}, indent=1)
        )


if __name__ == "__main__":
    main()
