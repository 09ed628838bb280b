"""How fast a cluster starts and how long produce stops when its leader goes.

- start-up: `tierbroker serve --brokers 3` from exec to every broker answering
  ApiVersions, against one broker (`tierbroker serve`) in the same run;
- kill -9 of the partition leader of three processes over a ZooKeeper (session timeout
  `--session-ms`), and SIGTERM of it (a controlled shutdown), while a producer
  (confluent-kafka, then kafka-python) sends one acks=all record every 5 ms:
  the time from the signal to a new leader in the metadata of the brokers left (polled
  every 10 ms), and to the first acknowledgement of a record the new leader appended (at
  or after the first offset of its leader epoch, read from its `leader-epoch-checkpoint`).
  The second includes the client's own way back to the new leader. Goals: the session
  timeout plus under 1 s for kill -9, under 1 s for SIGTERM.
- the same kill -9 with a tiered topic on S3 (moto's server; 1 KiB records, small
  segments): also the time to the first segment the new leader copies to the remote
  tier (its RemoteCopyRequestsPerSec counter, polled every 10 ms), against its first
  acknowledgement in the same run.

    python -m benchmarks.failover                    # about 3 minutes on 2 cores
    python -m benchmarks.failover --repeat 5 --session-ms 4000
    python -m benchmarks.failover --tiered-only      # the tiered kill -9 alone
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from benchmarks.replication import common, serving, zookeeper_member
from benchmarks.targets import ROOT, api_versions_answered, free_port, tierbroker_command
from benchmarks.tiering import Moto
from tests.zookeeper import ZooKeeperServer
from tierbroker.storage.checkpoints import read_epoch_entries

TOPIC = "failover"
TIERED_SEGMENT_BYTES = 128 * 1024  # a segment rolls about every 0.6 s at 1 KiB per 5 ms


def start_up(brokers: int) -> float:
    """Seconds from exec to every broker answering."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    port = free_port()
    command = [tierbroker_command(), "serve", "--brokers", str(brokers)]
    for setting in common(workdir / "data", port):
        command += ["--override", setting]
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=ROOT
    )
    try:
        waiting = {port + i for i in range(brokers)}
        while waiting:
            waiting = {p for p in waiting if not api_versions_answered(p, timeout_s=0.05)}
            if process.poll() is not None:
                raise RuntimeError("tierbroker exited while starting")
        return time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


class Ticker(threading.Thread):
    """One acks=all record (`value`) every 5 ms; the time and offset of every
    acknowledgement."""

    def __init__(self, value: bytes) -> None:
        super().__init__(daemon=True)
        self.value = value
        self.acked: list[float] = []
        self.offsets: list[int] = []
        self.running = True

    def _acknowledged(self, offset: int) -> None:
        self.offsets.append(offset)
        self.acked.append(time.perf_counter())


class LibrdkafkaTicker(Ticker):
    """confluent-kafka (librdkafka), reconnecting within 100 ms, otherwise as it comes."""

    def __init__(self, bootstrap: str, value: bytes = b"tick") -> None:
        super().__init__(value)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 0,
                "log_level": 0,
                "reconnect.backoff.max.ms": 100,
            }
        )

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self._acknowledged(message.offset() or 0)

    def run(self) -> None:
        while self.running:
            self.producer.produce(TOPIC, self.value, on_delivery=self._delivered)
            self.producer.poll(0.005)
        self.producer.flush(30)


class KafkaPythonTicker(Ticker):
    """kafka-python, reconnecting within 100 ms, otherwise as it comes."""

    def __init__(self, bootstrap: str, value: bytes = b"tick") -> None:
        super().__init__(value)
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap.split(","),
            acks="all",
            linger_ms=0,
            reconnect_backoff_max_ms=100,
        )

    def run(self) -> None:
        while self.running:
            sent = self.producer.send(TOPIC, self.value)
            sent.add_callback(lambda record: self._acknowledged(record.offset))
            time.sleep(0.005)
        self.producer.flush(30)
        self.producer.close(5)


CLIENTS: dict[str, Callable[[str, bytes], Ticker]] = {
    "confluent-kafka": LibrdkafkaTicker,
    "kafka-python": KafkaPythonTicker,
}


def failover(
    sig: int, session_ms: int, client: str, tiered: Moto | None = None, task_interval_ms: int = 0
) -> tuple[float, float, float]:
    """Seconds from `sig` to the leader to (a new leader in the metadata of the brokers
    left, the first acknowledgement of a record that new leader appended, its first segment
    copied to the remote tier: 0 unless `tiered`, the S3 server of a tiered topic)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    zookeeper = ZooKeeperServer(workdir / "zk").start()
    ports = [free_port() for _ in range(3)]
    metrics_ports = [free_port() for _ in range(3)]
    topic_config = {"min.insync.replicas": "2"}
    if tiered is not None:
        topic_config |= {
            "remote.storage.enable": "true",
            "segment.bytes": str(TIERED_SEGMENT_BYTES),
            "local.retention.bytes": str(4 * TIERED_SEGMENT_BYTES),
        }
    try:
        with ExitStack() as stack:
            processes = []
            for broker_id, port in enumerate(ports):
                settings = zookeeper_member(workdir, port, broker_id, zookeeper.connect, session_ms)
                if tiered is not None:
                    settings += [
                        "remote.log.storage.system.enable=true",
                        f"remote.log.manager.task.interval.ms={task_interval_ms}",
                        f"metrics.port={metrics_ports[broker_id]}",
                        *(f"{k}={v}" for k, v in tiered.overrides().items()),
                    ]
                processes.append(stack.enter_context(serving(settings, workdir, f"b{broker_id}")))
            bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports)
            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
            topic = NewTopic(TOPIC, 1, 3, config=topic_config)
            admin.create_topics([topic])[TOPIC].result(30)
            ticker = CLIENTS[client](bootstrap, b"tick" if tiered is None else b"t" * 1024)
            ticker.start()
            while len(ticker.acked) < 200:
                time.sleep(0.05)
            leader = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[0].leader
            old_epoch = _epochs(workdir, leader)[-1][0]
            survivors = ",".join(f"127.0.0.1:{p}" for i, p in enumerate(ports) if i != leader)
            watcher = AdminClient({"bootstrap.servers": survivors, "log_level": 0})
            watcher.list_topics(TOPIC, timeout=10)  # connected before the signal
            signalled = time.perf_counter()
            processes[leader].send_signal(sig)
            new_leader = leader
            while new_leader in (leader, -1):
                time.sleep(0.01)
                metadata = watcher.list_topics(TOPIC, timeout=10)
                new_leader = metadata.topics[TOPIC].partitions[0].leader
            elected = time.perf_counter() - signalled
            while (epochs := _epochs(workdir, new_leader))[-1][0] <= old_epoch:
                time.sleep(0.01)
            epoch_start = epochs[-1][1]
            deadline = time.monotonic() + 60
            first: float | None = None
            copied: float | None = None if tiered is not None else signalled
            while (first is None or copied is None) and time.monotonic() < deadline:
                time.sleep(0.01)
                acked = list(zip(ticker.acked, ticker.offsets, strict=False))
                first = first or next((t for t, offset in acked if offset >= epoch_start), None)
                if copied is None and _segments_copied(metrics_ports[new_leader]) > 0:
                    copied = time.perf_counter()
            ticker.running = False
            ticker.join(60)
            if first is None or copied is None:
                raise RuntimeError("no acknowledgement or copy from the new leader within 60 s")
            return elected, first - signalled, copied - signalled
    finally:
        zookeeper.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _segments_copied(metrics_port: int) -> float:
    """The broker's RemoteCopyRequestsPerSec for the topic: segments it copied since it
    started (it led nothing of the topic before)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    prefix = f'RemoteCopyRequestsPerSec_total{{topic="{TOPIC}"}} '
    line = next((x for x in text.splitlines() if x.startswith(prefix)), prefix + "0")
    return float(line[len(prefix) :])


def _epochs(workdir: Path, broker_id: int) -> list[tuple[int, int]]:
    """(leader epoch, start offset) of the topic's partition on `broker_id`."""
    return read_epoch_entries(
        workdir / f"broker-{broker_id}" / f"{TOPIC}-0" / "leader-epoch-checkpoint"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--session-ms", type=int, default=2000)
    parser.add_argument(
        "--task-interval-ms", type=int, default=1000, help="remote.log.manager.task.interval.ms"
    )
    parser.add_argument("--tiered-only", action="store_true", help="only the tiered kill -9")
    args = parser.parse_args()
    moto = Moto()
    try:
        tiered = [
            failover(
                signal.SIGKILL, args.session_ms, "confluent-kafka", moto, args.task_interval_ms
            )
            for _ in range(args.repeat)
        ]
    finally:
        moto.stop()

    def line(name: str, values: list[float], unit: str = "s") -> str:
        spread = f"({min(values):.2f}-{max(values):.2f})"
        return f"{name:<62} median {statistics.median(values):6.2f} {unit}  {spread}"

    session = f"session {args.session_ms} ms"
    print(line(f"tiered on S3: kill -9 ({session}): to a new leader", [t[0] for t in tiered]))
    print(line("tiered on S3: kill -9: to the new leader's first ack", [t[1] for t in tiered]))
    print(line("tiered on S3: kill -9: to its first segment copied", [t[2] for t in tiered]))
    ratios = [t[2] / t[1] for t in tiered]
    print(line("tiered on S3: first segment copied / first ack, per run", ratios, "x"))
    if args.tiered_only:
        return
    single = [start_up(1) for _ in range(args.repeat)]
    three = [start_up(3) for _ in range(args.repeat)]
    runs = {
        (client, sig): [failover(sig, args.session_ms, client) for _ in range(args.repeat)]
        for client in CLIENTS
        for sig in (signal.SIGKILL, signal.SIGTERM)
    }
    print(line("start-up, one broker", single))
    print(line("start-up, three brokers in one process", three))
    for client in CLIENTS:
        killed, stopped = runs[client, signal.SIGKILL], runs[client, signal.SIGTERM]
        print(line(f"{client}: kill -9 ({session}): to a new leader", [k[0] for k in killed]))
        print(line(f"{client}: kill -9: to the new leader's first ack", [k[1] for k in killed]))
        print(line(f"{client}: SIGTERM: to a new leader", [s[0] for s in stopped]))
        print(line(f"{client}: SIGTERM: to the new leader's first ack", [s[1] for s in stopped]))
    print(
        "(medians of",
        args.repeat,
        "runs; start-up from exec to every broker answering)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
