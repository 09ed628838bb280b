"""What replication costs: produce throughput with acks=all and replication factor 3 against
acks=1 on one broker, with the machine's ceiling measured in the same run.

The load generator keeps the brokers the bottleneck: pre-encoded Produce requests (one
~256 KiB batch of 1 KiB values each) go over several connections at once, 4 in flight on
each, as in `benchmarks.ceiling`; a Python producer would be the limit itself and hide
what replication costs. A broker handles one request of a connection at a time (as
Kafka does), so an acks=all produce holds its connection for a replication round trip:
with fewer connections than partitions the brokers wait on that latency rather than
work, and each follower fetch carries one or two batches. The default shape is one
connection per partition (6); `--connections`, `--partitions`, `--batch-kib` and
`--in-flight` change it. Every setup gets the same requests:

- single: one `tierbroker serve`, replication factor 1, acks=1 (the baseline);
- single x3: the same broker and topic taking every request three times, to three
  partitions: the bytes the three replicas of a replicated setup write, received and
  written by one broker process (the MiB/s counts each request's bytes once);
- in-process: `tierbroker serve --brokers 3`, replication factor 3, acks=all,
  min.insync.replicas=2, every partition led by broker 0 (so brokers 1 and 2 only follow);
- zookeeper: three `tierbroker serve` processes over a ZooKeeper, the same topic.

Setups alternate round by round, and each writes into pages just freed (as
`benchmarks.tiering` does: this machine hands idle free pages back to its host, and a
page written after that costs several times more). A produce answered with an error
ends the run. Reported per setup: MiB/s, broker CPU seconds per produced MiB (all
brokers), and for the ZooKeeper cluster the followers' CPU seconds per MiB they
replicated (brokers 1 and 2 lead nothing). Ratios are against `single` and against
`single x3`, which does the same disk writes on one core as the in-process cluster does.
Batches must stay under `message.max.bytes` (`--batch-kib` 960 at most).

    python -m benchmarks.replication                      # about 90 s on 2 cores
    python -m benchmarks.replication --mib 128 --repeat 1
    python -m benchmarks.replication --connections 3      # latency-bound: see above
"""

from __future__ import annotations

import argparse
import datetime
import io
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.serial import entity_writer

from benchmarks.ceiling import measure as measure_ceiling
from benchmarks.kafka_cluster import kafka_nodes, wait_for_leader
from benchmarks.targets import (
    ROOT,
    api_versions_answered,
    free_port,
    process_cpu_seconds,
    tierbroker_command,
)
from benchmarks.tiering import recycle_page_cache
from tests.zookeeper import ZooKeeperServer
from tierbroker.protocol.client_codec import decode_response
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch

TOPIC = "load"
VALUE = b"v" * 1024


@dataclass(frozen=True)
class Shape:
    """What the load generator sends: `connections` sockets, `in_flight` unanswered
    requests on each, one batch of `batch_kib` KiB of 1 KiB values per request, spread
    over `partitions` partitions (each written `copies` times, to as many partitions)."""

    connections: int = 6
    partitions: int = 6
    batch_kib: int = 256
    in_flight: int = 4
    copies: int = 1

    @property
    def topic_partitions(self) -> int:
        return self.partitions * self.copies


@dataclass
class Result:
    mib_per_s: float
    cpu_s_per_mib: float
    follower_cpu_s_per_mib: float | None = None


def encode_produce(partition: int, acks: int, batch: bytes, correlation_id: int) -> bytes:
    request = ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            TopicProduceData(
                name=TOPIC, partition_data=(PartitionProduceData(index=partition, records=batch),)
            ),
        ),
    )  # type: ignore[arg-type]
    header_cls = ProduceRequest.__header_schema__
    out = io.BytesIO()
    entity_writer(header_cls)(
        out,
        header_cls(
            request_api_key=0, request_api_version=9, correlation_id=correlation_id,
            client_id="bench",
        ),
    )  # fmt: skip
    entity_writer(ProduceRequest)(out, request)
    body = out.getvalue()
    return struct.pack(">i", len(body)) + body


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


def send_requests(port: int, frames: list[bytes], count: int, in_flight: int) -> None:
    """Send `count` requests, cycling through `frames`, `in_flight` unanswered at most;
    raise on the first partition answered with an error (a refused batch is no load)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sent = answered = 0
        while answered < count:
            while sent < count and sent - answered < in_flight:
                sock.sendall(frames[sent % len(frames)])
                sent += 1
            (size,) = struct.unpack(">i", _exactly(sock, 4))
            response = decode_response(0, 9, _exactly(sock, size))
            for topic in response.responses:
                for partition in topic.partition_responses:
                    if partition.error_code != ErrorCode.none:
                        name = ErrorCode(partition.error_code).name.upper()
                        raise RuntimeError(f"produce to partition {partition.index}: {name}")
            answered += 1


def load(port: int, acks: int, mib: int, shape: Shape) -> tuple[int, float]:
    """(payload bytes, seconds) of `mib` MiB of produce over `shape.connections`
    connections; with `shape.copies` > 1 each request goes that many times, to as many
    partitions, and its bytes count once."""
    batch = build_batch([(None, VALUE, [], 0)] * max(1, shape.batch_kib * 1024 // len(VALUE)))
    n = shape.connections
    per_connection = max(shape.in_flight, mib * 1024 * 1024 // len(batch) // n)
    work = []
    for i in range(n):
        mine = [p for p in range(shape.partitions) if p % n == i % n] or [i % shape.partitions]
        frames = [
            encode_produce(p + copy * shape.partitions, acks, batch, p)
            for p in mine
            for copy in range(shape.copies)
        ]
        work.append((port, frames, per_connection * shape.copies, shape.in_flight))
    started = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        for done in [pool.submit(send_requests, *args) for args in work]:
            done.result()  # a connection's error, raised here
    return per_connection * n * len(batch), time.perf_counter() - started


def create_topic(
    bootstrap: str, replicated: bool, partitions: int, replicas: tuple[int, ...] = (0, 1, 2)
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    if replicated:
        topic = NewTopic(
            TOPIC,
            num_partitions=partitions,
            replica_assignment=[list(replicas)] * partitions,
            config={"min.insync.replicas": "2"},
        )
    else:
        topic = NewTopic(TOPIC, partitions, 1)
    admin.create_topics([topic])[TOPIC].result(30)


@contextmanager
def serving(
    args: list[str], workdir: Path, name: str, launcher: list[str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A `tierbroker serve` process with `args` (properties, or `--flag value`), started
    by `launcher` (the `tierbroker` command unless given); stopped afterwards."""
    port = int(next(a for a in args if a.startswith("listeners=")).rsplit(":", 1)[1])
    command = [*(launcher or [tierbroker_command()]), "serve"]
    for a in args:
        command += ["--override", a] if "=" in a and not a.startswith("--") else [a]
    log = open(workdir / f"{name}.log", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not api_versions_answered(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {(workdir / f'{name}.log').read_text()}")
            time.sleep(0.05)
        yield process
    finally:
        process.terminate()
        process.wait(60)
        log.close()


def common(workdir: Path, port: int) -> list[str]:
    return [
        f"listeners=PLAINTEXT://127.0.0.1:{port}",
        f"log.dirs={workdir}",
        "metrics.port=-1",
        "remote.log.storage.system.enable=false",
        "log.segment.bytes=268435456",
    ]


def zookeeper_member(
    workdir: Path, port: int, broker_id: int, connect: str, session_ms: int | None = None
) -> list[str]:
    """`common` settings of broker `broker_id` of a cluster over the ZooKeeper at `connect`."""
    return [
        *common(workdir / f"broker-{broker_id}", port),
        f"broker.id={broker_id}",
        "metadata.store=zookeeper",
        f"zookeeper.connect={connect}/bench",
        *([f"zookeeper.session.timeout.ms={session_ms}"] if session_ms is not None else []),
    ]


def run_single(mib: int, shape: Shape) -> Result:
    workdir = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    port = free_port()
    try:
        with serving(common(workdir / "data", port), workdir, "single") as process:
            create_topic(f"127.0.0.1:{port}", False, shape.topic_partitions)
            load(port, 1, 4, shape)  # warm-up
            recycle_page_cache(mib * shape.copies)
            cpu = process_cpu_seconds(process.pid)
            size, seconds = load(port, 1, mib, shape)
            cpu = process_cpu_seconds(process.pid) - cpu
        return Result(size / 2**20 / seconds, cpu / (size / 2**20))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_single_x3(mib: int, shape: Shape) -> Result:
    return run_single(mib, replace(shape, copies=3))


def run_in_process(mib: int, shape: Shape) -> Result:
    workdir = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    port = free_port()
    while any(_taken(port + i) for i in (1, 2)):
        port = free_port()
    try:
        args = [*common(workdir / "data", port), "--brokers", "3"]
        with serving(args, workdir, "in-process") as process:
            create_topic(f"127.0.0.1:{port}", True, shape.partitions)
            load(port, -1, 4, shape)
            recycle_page_cache(mib * 3)
            cpu = process_cpu_seconds(process.pid)
            size, seconds = load(port, -1, mib, shape)
            cpu = process_cpu_seconds(process.pid) - cpu
        return Result(size / 2**20 / seconds, cpu / (size / 2**20))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def run_zookeeper(mib: int, shape: Shape) -> Result:
    workdir = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    zookeeper = ZooKeeperServer(workdir / "zk").start()
    try:
        ports = [free_port() for _ in range(3)]
        with ExitStack() as stack:
            processes = []
            for broker_id, port in enumerate(ports):
                args = zookeeper_member(workdir, port, broker_id, zookeeper.connect)
                processes.append(stack.enter_context(serving(args, workdir, f"zk-{broker_id}")))
            create_topic(f"127.0.0.1:{ports[0]}", True, shape.partitions)
            load(ports[0], -1, 4, shape)
            recycle_page_cache(mib * 3)
            before = [process_cpu_seconds(p.pid) for p in processes]
            size, seconds = load(ports[0], -1, mib, shape)
            spent = [process_cpu_seconds(p.pid) - b for p, b in zip(processes, before, strict=True)]
        mib_moved = size / 2**20
        return Result(mib_moved / seconds, sum(spent) / mib_moved, sum(spent[1:]) / 2 / mib_moved)
    finally:
        zookeeper.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# Kafka's JVM compiles its hot paths in the first tens of MiB; tierbroker has no JIT.
KAFKA_WARM_UP_MIB = 64


def run_kafka(mib: int, shape: Shape, nodes: int) -> Result:
    """Apache Kafka: one node with replication factor 1 and acks=1, or three with
    replication factor 3, acks=all, min.insync.replicas=2, every partition led by node 1."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-replication-kafka-"))
    try:
        with kafka_nodes(workdir, nodes) as members:
            leader = members[0]
            replicated, acks = nodes > 1, -1 if nodes > 1 else 1
            create_topic(leader.bootstrap_servers, replicated, shape.partitions, (1, 2, 3))
            wait_for_leader(leader.bootstrap_servers, TOPIC, leader.node_id)
            warm_up(leader.port, acks, shape, KAFKA_WARM_UP_MIB)
            recycle_page_cache(mib * nodes)
            pids = [m.process.pid for m in members if m.process is not None]
            before = [process_cpu_seconds(pid) for pid in pids]
            size, seconds = load(leader.port, acks, mib, shape)
            spent = [process_cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
        mib_moved = size / 2**20
        followers = sum(spent[1:]) / 2 / mib_moved if nodes > 1 else None
        return Result(mib_moved / seconds, sum(spent) / mib_moved, followers)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def warm_up(port: int, acks: int, shape: Shape, mib: int, timeout_s: float = 30.0) -> None:
    """`mib` MiB of load, again until no partition refuses it: a Kafka node shows itself
    the leader in its metadata a moment before its replica manager takes the partition."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            load(port, acks, mib, shape)
            return
        except RuntimeError as e:
            if "NOT_LEADER_OR_FOLLOWER" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


SETUPS: dict[str, Callable[[int, Shape], Result]] = {
    "single": run_single,
    "single x3": run_single_x3,
    "in-process": run_in_process,
    "zookeeper": run_zookeeper,
    "kafka single": partial(run_kafka, nodes=1),
    "kafka x3": partial(run_kafka, nodes=3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--connections", type=int, default=Shape.connections)
    parser.add_argument("--partitions", type=int, default=Shape.partitions)
    parser.add_argument("--batch-kib", type=int, default=Shape.batch_kib)
    parser.add_argument("--in-flight", type=int, default=Shape.in_flight)
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated, in order")
    args = parser.parse_args()
    shape = Shape(args.connections, args.partitions, args.batch_kib, args.in_flight)
    setups = {name: SETUPS[name] for name in args.setups.split(",")}
    runs: dict[str, list[Result]] = {name: [] for name in setups}
    for round_ in range(args.repeat):
        order = list(setups) if round_ % 2 == 0 else list(reversed(setups))
        for name in order:
            runs[name].append(setups[name](args.mib, shape))
            last = runs[name][-1]
            print(f"round {round_ + 1} {name}: {last.mib_per_s:.1f} MiB/s", file=sys.stderr)
    request_bytes = shape.batch_kib * 1024
    ceiling, _ = measure_ceiling(args.mib * 2**20, args.mib * 1024, request_bytes, repeat=1)
    print(
        f"{shape.connections} connections x {shape.in_flight} in flight, "
        f"{shape.partitions} partitions, {shape.batch_kib} KiB per request; "
        f"ceiling (loopback into a file): {ceiling.mib_per_s:.0f} MiB/s"
    )
    print("\n".join(report(runs)))


def report(runs: dict[str, list[Result]]) -> list[str]:
    """Medians per setup, each against its own broker's single node (and `single x3`),
    and tierbroker's replicated setups against Apache Kafka's, per round."""

    def median_rate(name: str) -> float | None:
        return statistics.median(r.mib_per_s for r in runs[name]) if name in runs else None

    lines = [
        f"{'setup':<12} {'MiB/s':>8} {'vs single':>10} {'vs x3':>7} {'CPU s/MiB':>10} "
        f"{'follower CPU s/MiB':>19}"
    ]
    for name, results in runs.items():
        rate = statistics.median(r.mib_per_s for r in results)
        base = median_rate("kafka single" if name.startswith("kafka") else "single")
        same_writes = None if name.startswith("kafka") else median_rate("single x3")
        cpu = statistics.median(r.cpu_s_per_mib for r in results)
        followers = [r.follower_cpu_s_per_mib for r in results if r.follower_cpu_s_per_mib]
        follower = f"{statistics.median(followers):.4f}" if followers else "-"
        vs_base = f"{rate / base:.2f}x" if base else "-"
        vs_x3 = f"{rate / same_writes:.2f}x" if same_writes else "-"
        lines.append(
            f"{name:<12} {rate:>8.1f} {vs_base:>10} {vs_x3:>7} {cpu:>10.4f} {follower:>19}"
        )
    for mine, theirs in (
        ("single", "kafka single"),
        ("in-process", "kafka x3"),
        ("zookeeper", "kafka x3"),
    ):
        if mine in runs and theirs in runs:
            pairs = list(zip(runs[mine], runs[theirs], strict=True))
            rates = [a.mib_per_s / b.mib_per_s for a, b in pairs]
            cpus = [a.cpu_s_per_mib / b.cpu_s_per_mib for a, b in pairs]
            lines.append(
                f"{mine} / {theirs}: MiB/s {statistics.median(rates):.2f}x "
                f"({min(rates):.2f}-{max(rates):.2f}), CPU s/MiB {statistics.median(cpus):.2f}x "
                f"({min(cpus):.2f}-{max(cpus):.2f})"
            )
    return lines


if __name__ == "__main__":
    main()
