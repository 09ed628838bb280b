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

    python -m benchmarks.failover                    # about 2 minutes on 2 cores
    python -m benchmarks.failover --repeat 5 --session-ms 4000
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
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from benchmarks.replication import common, serving
from benchmarks.targets import ROOT, api_versions_answered, free_port, tierbroker_command
from tests.zookeeper import ZooKeeperServer
from tierbroker.storage.checkpoints import read_epoch_entries

TOPIC = "failover"


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
    """One acks=all record every 5 ms; the time and offset of every acknowledgement."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.acked: list[float] = []
        self.offsets: list[int] = []
        self.running = True

    def _acknowledged(self, offset: int) -> None:
        self.offsets.append(offset)
        self.acked.append(time.perf_counter())


class LibrdkafkaTicker(Ticker):
    """confluent-kafka (librdkafka), reconnecting within 100 ms, otherwise as it comes."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__()
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
            self.producer.produce(TOPIC, b"tick", on_delivery=self._delivered)
            self.producer.poll(0.005)
        self.producer.flush(30)


class KafkaPythonTicker(Ticker):
    """kafka-python, reconnecting within 100 ms, otherwise as it comes."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__()
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap.split(","),
            acks="all",
            linger_ms=0,
            reconnect_backoff_max_ms=100,
        )

    def run(self) -> None:
        while self.running:
            sent = self.producer.send(TOPIC, b"tick")
            sent.add_callback(lambda record: self._acknowledged(record.offset))
            time.sleep(0.005)
        self.producer.flush(30)
        self.producer.close(5)


CLIENTS: dict[str, Callable[[str], Ticker]] = {
    "confluent-kafka": LibrdkafkaTicker,
    "kafka-python": KafkaPythonTicker,
}


def failover(sig: int, session_ms: int, client: str) -> tuple[float, float]:
    """Seconds from `sig` to the leader to (a new leader in the metadata of the brokers
    left, the first acknowledgement of a record that new leader appended)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    zookeeper = ZooKeeperServer(workdir / "zk").start()
    ports = [free_port() for _ in range(3)]
    try:
        with ExitStack() as stack:
            processes = []
            for broker_id, port in enumerate(ports):
                settings = [
                    *common(workdir / f"broker-{broker_id}", port),
                    f"broker.id={broker_id}",
                    "metadata.store=zookeeper",
                    f"zookeeper.connect={zookeeper.connect}/bench",
                    f"zookeeper.session.timeout.ms={session_ms}",
                ]
                processes.append(stack.enter_context(serving(settings, workdir, f"b{broker_id}")))
            bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports)
            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
            topic = NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})
            admin.create_topics([topic])[TOPIC].result(30)
            ticker = CLIENTS[client](bootstrap)
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
            while first is None and time.monotonic() < deadline:
                time.sleep(0.01)
                acked = list(zip(ticker.acked, ticker.offsets, strict=False))
                first = next((t for t, offset in acked if offset >= epoch_start), None)
            ticker.running = False
            ticker.join(60)
            if first is None:
                raise RuntimeError("no acknowledgement from the new leader within 60 s")
            return elected, first - signalled
    finally:
        zookeeper.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _epochs(workdir: Path, broker_id: int) -> list[tuple[int, int]]:
    """(leader epoch, start offset) of the topic's partition on `broker_id`."""
    return read_epoch_entries(
        workdir / f"broker-{broker_id}" / f"{TOPIC}-0" / "leader-epoch-checkpoint"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--session-ms", type=int, default=2000)
    args = parser.parse_args()
    single = [start_up(1) for _ in range(args.repeat)]
    three = [start_up(3) for _ in range(args.repeat)]
    runs = {
        (client, sig): [failover(sig, args.session_ms, client) for _ in range(args.repeat)]
        for client in CLIENTS
        for sig in (signal.SIGKILL, signal.SIGTERM)
    }

    def line(name: str, values: list[float]) -> str:
        spread = f"({min(values):.2f}-{max(values):.2f})"
        return f"{name:<62} median {statistics.median(values):6.2f} s  {spread}"

    print(line("start-up, one broker", single))
    print(line("start-up, three brokers in one process", three))
    for client in CLIENTS:
        killed, stopped = runs[client, signal.SIGKILL], runs[client, signal.SIGTERM]
        session = f"session {args.session_ms} ms"
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
