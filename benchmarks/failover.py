"""How fast a cluster starts and how long produce stops when its leader goes.

- start-up: `tierbroker serve --brokers 3` from exec to every broker answering
  ApiVersions, against one broker (`tierbroker serve`) in the same run;
- kill -9 of the partition leader of three processes over a ZooKeeper (session timeout
  `--session-ms`), and SIGTERM of it (a controlled shutdown): how long produce stops,
  the longest gap between two acknowledgements around the signal, while a
  confluent-kafka producer sends one acks=all record every 5 ms. Goals: the session
  timeout plus under 1 s for kill -9, under 1 s for SIGTERM.

    python -m benchmarks.failover                    # about a minute on 2 cores
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
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.replication import common, serving
from benchmarks.targets import ROOT, api_versions_answered, free_port, tierbroker_command
from tests.zookeeper import ZooKeeperServer

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
    """One acks=all record every 5 ms; the time of every acknowledgement."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 0,
                "log_level": 0,
                "reconnect.backoff.max.ms": 100,
            }
        )
        self.acked: list[float] = []
        self.running = True

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.acked.append(time.perf_counter())

    def run(self) -> None:
        while self.running:
            self.producer.produce(TOPIC, b"tick", on_delivery=self._delivered)
            self.producer.poll(0.005)
        self.producer.flush(30)


def failover(sig: int, session_ms: int) -> float:
    """The longest gap in seconds between acknowledgements around `sig` to the leader."""
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
            ticker = Ticker(bootstrap)
            ticker.start()
            while len(ticker.acked) < 200:
                time.sleep(0.05)
            leader = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[0].leader
            signalled = time.perf_counter()
            processes[leader].send_signal(sig)
            while (
                not any(t > signalled for t in ticker.acked[-50:]) or ticker.acked[-1] < signalled
            ):
                time.sleep(0.01)
            first = next(t for t in ticker.acked if t > signalled)
            ticker.running = False
            ticker.join(60)
            return first - signalled
    finally:
        zookeeper.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--session-ms", type=int, default=2000)
    args = parser.parse_args()
    single = [start_up(1) for _ in range(args.repeat)]
    three = [start_up(3) for _ in range(args.repeat)]
    killed = [failover(signal.SIGKILL, args.session_ms) for _ in range(args.repeat)]
    stopped = [failover(signal.SIGTERM, args.session_ms) for _ in range(args.repeat)]

    def line(name: str, values: list[float]) -> str:
        spread = f"({min(values):.2f}-{max(values):.2f})"
        return f"{name:<44} median {statistics.median(values):6.2f} s  {spread}"

    print(line("start-up, one broker", single))
    print(line("start-up, three brokers in one process", three))
    print(line(f"produce stopped: kill -9 (session {args.session_ms} ms)", killed))
    print(line("produce stopped: SIGTERM (controlled shutdown)", stopped))
    print(
        "(medians of",
        args.repeat,
        "runs; start-up from exec to every broker answering)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
