"""Log compaction: how fast the cleaner cleans, and what its passes cost the rest of the broker.

    python -m benchmarks.log_cleaner [--mib 64] [--rounds 1] [--load-rounds 4] [--json OUT]
    python -m benchmarks.log_cleaner --rounds 2                       # about 3 minutes
    python -m benchmarks.log_cleaner --shapes 100-none-1m --skip-load --skip-kafka --profile

Cleaner throughput, per record shape (value size, codec, producer batch size): a topic
of 8 MiB segments gets `--mib` MiB of values over `--keys` keys (drawn at random, the same
sequence on every broker; each value its own, half random, half zeros) from
confluent-kafka (acks=1, linger.ms=5, the shape's batch.size and compression.type) as
`cleanup.policy=delete`; then `cleanup.policy=compact` is set, and the broker's own log
line for the pass is read. Measured: MiB of log the pass rewrote (the rolled segments,
all dirty on a first pass) per second of the pass: what Apache Kafka's cleaner logs as
"MB of log processed in S seconds (R MB/sec)" (its MB are MiB). Baselines of the same
run: a plain copy of the same segment files just before the pass (read 512 KiB at a time
as the cleaner reads, written 1 MiB at a time and fsynced per file as it writes), and
Apache Kafka's cleaner on the same records from the same client (one KRaft node as
`tests/apache_kafka.py` starts it, `kafka-server-start.sh`'s JVM options, a log4j
configuration that keeps its cleaner thread's INFO lines). Both brokers run with
`log.cleaner.backoff.ms=100` and first clean a 16 MiB topic (tierbroker's worker process
starts, Kafka's JIT warms up). `--rounds` rounds, in ABBA order.

Produce while cleaning, and the event loop: one `tierbroker serve` whose loop is timed
(`LoopProbe`: each callback's CPU time on the loop's thread and wall time, and how late
a 1 ms timer fires: what a request arriving then waits), its cleaner worker process
competing for the machine's two cores with the broker and the client. confluent-kafka
(in this process) produces `--burst-mib` MiB bursts of 1 KiB values (acks=1,
linger.ms=5, batch.size 1 MB) to another topic, which keeps 128 MiB (so that gigabytes
of dirty pages do not build up for writeback to flush into a later round): `--bursts`
bursts with nothing to clean (the baseline), and bursts while the cleaner passes over a
`--load-mib` MiB topic of the `--load-shape` shape, of which those wholly inside the
pass count. Stalls: the idle loop for `--idle-s` s (the baseline) against a pass over
another such topic with no produce. `--load-rounds` rounds, the produce arms taking turns
to go first. `--cleaner-nice N` adds a third arm, bursts while the worker process cleans
at nice N (a what-if for `storage/cleaner.py`; setting it back to 0 needs root).

`--profile` also runs each shape's pass in this process (`storage.cleaner.clean` on a
copy of the segments: once timed, once under cProfile) and prints where its time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from benchmarks.probed_serve import describe
from benchmarks.record_validation import cpu_seconds
from benchmarks.targets import (
    KAFKA_JVM_OPTIONS,
    ROOT,
    TargetUnavailable,
    free_port,
    process_tree,
    require_apache_kafka,
    spawn,
    start_tierbroker,
    stop,
)
from tests.apache_kafka import ApacheKafka
from tierbroker.storage.cleaner import IO_BUFFER_BYTES, CleaningTask, SegmentToClean, clean
from tierbroker.storage.topic_partition import TopicPartition

MIB = 1 << 20
SEGMENT_BYTES = 8 * MIB
WRITE_BYTES = 1 << 20  # the cleaner appends its output this many bytes at a time
WARMUP_MIB = 16
CLEANER = {"log.cleaner.backoff.ms": "100"}
# The produced-to topic keeps 256 MiB: a few GiB of bursts neither fill the disk nor
# leave gigabytes of dirty pages for writeback to flush into a later round.
OTHER_TOPIC = {
    "segment.bytes": str(64 * MIB),
    "retention.bytes": str(128 * MIB),
    "file.delete.delay.ms": "0",
}
PASS_TIMEOUT_S = 120.0
PRODUCE_VALUE_BYTES = 1024
TICK_S = 0.001
WINDOW_S = 0.1


@dataclass(frozen=True)
class Shape:
    value_bytes: int
    codec: str  # the producer's compression.type
    batch_bytes: int  # the producer's batch.size

    @property
    def label(self) -> str:
        batch = f"{self.batch_bytes // 1024} KiB" if self.batch_bytes < 10**6 else "1 MB"
        return f"{self.value_bytes} B {self.codec}, {batch} batches"


SHAPES = {
    "100-none-16k": Shape(100, "none", 16_384),
    "100-none-1m": Shape(100, "none", 1_000_000),
    "100-lz4-1m": Shape(100, "lz4", 1_000_000),
    "1000-none-1m": Shape(1000, "none", 1_000_000),
    "1000-zstd-1m": Shape(1000, "zstd", 1_000_000),
    "1000-lz4-16k": Shape(1000, "lz4", 16_384),
}


def produce_shape(bootstrap: str, topic: str, shape: Shape, mib: int, keys: int) -> int:
    """`mib` MiB of the shape's values over `keys` keys, the same records on every call;
    the number of records."""
    rnd = random.Random(1)
    count = mib * MIB // shape.value_bytes
    half = shape.value_bytes // 2
    noise = rnd.randbytes(count * half)  # each value its own: no repeats for the codecs
    zeros = bytes(shape.value_bytes - half)
    names = [b"key-%07d" % i for i in range(keys)]
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
        "batch.size": shape.batch_bytes, "compression.type": shape.codec,
    })  # fmt: skip
    for i in range(count):
        key, value = names[rnd.randrange(keys)], noise[i * half : (i + 1) * half] + zeros
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:  # the local queue is full: let librdkafka send some
                producer.poll(0.001)
    if producer.flush(120) != 0:
        raise RuntimeError(f"{topic}: records still undelivered after 120 s")
    return count


def create_topic(admin: AdminClient, topic: str, config: dict[str, str] | None = None) -> None:
    config = {"segment.bytes": str(SEGMENT_BYTES), **(config or {})}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(30)


def compact(admin: AdminClient, topic: str) -> None:
    entry = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)


@dataclass(frozen=True)
class Pass:
    """One cleaner pass over a log, as the broker logged it."""

    log_bytes: int  # of the segments it rewrote
    seconds: float
    mib_per_s: float
    ended_at: float  # unix time of the log line
    extra: dict[str, float] = field(default_factory=dict)


TIERBROKER_PASS = re.compile(
    r"^\[(?P<at>[\d-]+ [\d:]+),(?P<ms>\d{3})\] INFO tierbroker\.storage\.log_cleaner: "
    r"(?P<tp>\S+): cleaned up to offset \d+: (?P<before>\d+) bytes -> (?P<after>\d+) .*? "
    r"in (?P<s>[\d.]+)s \(.*?\); (?P<kept>\d+) of (?P<read>\d+) records",
    re.M,
)
KAFKA_PASS = re.compile(
    r"^\[(?P<at>[\d-]+ [\d:]+),(?P<ms>\d{3})\] INFO \[kafka-log-cleaner-thread-\d+\]: \s*"
    r"Log cleaner thread \d+ cleaned log (?P<tp>\S+) .*?\n\s*(?P<mb>[\d,.]+) MB of log "
    r"processed in (?P<s>[\d,.]+) seconds \((?P<rate>[\d,.]+) MB/sec\)\.\n\s*Indexed "
    r"[\d,.]+ MB in [\d.]+ seconds \([\d,.]+ Mb/sec, (?P<index>[\d.]+)%",
    re.M,
)
KAFKA_LOG4J = """\
status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.cleaner.name = org.apache.kafka.storage.internals.log.LogCleaner$CleanerThread
logger.cleaner.level = INFO
"""


def logged_at(match: re.Match[str]) -> float:
    """The unix time of a log line's `[YYYY-MM-DD HH:MM:SS,mmm]` (local time)."""
    return time.mktime(time.strptime(match["at"], "%Y-%m-%d %H:%M:%S")) + int(match["ms"]) / 1e3


def tierbroker_pass(match: re.Match[str]) -> Pass:
    seconds, before = float(match["s"]), int(match["before"])
    extra = {"size_reduction": 1 - int(match["after"]) / before, "records": int(match["read"])}
    return Pass(before, seconds, before / MIB / max(seconds, 0.005), logged_at(match), extra)


def kafka_pass(match: re.Match[str]) -> Pass:
    def number(name: str) -> float:
        return float(match[name].replace(",", ""))

    extra = {"index_share": number("index") / 100}
    return Pass(int(number("mb") * MIB), number("s"), number("rate"), logged_at(match), extra)


@dataclass
class Target:
    """A running broker: where its partitions' files are and how its passes are logged."""

    name: str
    bootstrap: str
    pid: int
    data: Path
    log_path: Path
    stop: Callable[[], None]
    kafka: bool = False

    def find_pass(self, topic: str) -> Pass | None:
        pattern, parse = (
            (KAFKA_PASS, kafka_pass) if self.kafka else (TIERBROKER_PASS, tierbroker_pass)
        )
        for match in pattern.finditer(self.log_path.read_text(errors="replace")):
            if match["tp"] == f"{topic}-0":
                return parse(match)
        return None

    def wait_pass(self, topic: str) -> Pass:
        deadline = time.monotonic() + PASS_TIMEOUT_S
        while (found := self.find_pass(topic)) is None:
            if time.monotonic() > deadline or not Path(f"/proc/{self.pid}").exists():
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name}: no cleaner pass over {topic}-0 logged:\n{tail}")
            time.sleep(0.02)
        return found


def start_target(name: str, workdir: Path) -> Target:
    if name == "tierbroker":
        broker = start_tierbroker(workdir, CLEANER)
        return Target(
            name, broker.bootstrap, broker.process.pid, workdir / "data", broker.log_path,
            lambda: stop(broker),
        )  # fmt: skip
    require_apache_kafka()
    (workdir / "log4j2.properties").write_text(KAFKA_LOG4J)
    options = (*KAFKA_JVM_OPTIONS, f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}")
    kafka = ApacheKafka(workdir / "kafka", CLEANER, jvm_options=options).start()
    assert kafka.process is not None
    return Target(
        name, kafka.bootstrap_servers, kafka.process.pid, kafka.dir / "data",
        kafka.dir / "kafka.log", kafka.stop, kafka=True,
    )  # fmt: skip


def timed_copy(paths: list[Path], scratch: Path) -> tuple[int, float]:
    """Copy `paths` into `scratch` as the cleaner reads and writes, each file fsynced;
    (bytes, seconds). The copies are removed again."""
    scratch.mkdir(exist_ok=True)
    total, started = 0, time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as src, open(scratch / path.name, "wb") as dst:
            out = bytearray()
            while chunk := src.read(IO_BUFFER_BYTES):
                total += len(chunk)
                out += chunk
                if len(out) >= WRITE_BYTES:
                    dst.write(out)
                    out = bytearray()
            dst.write(out)
            dst.flush()
            os.fsync(dst.fileno())
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch)
    return total, seconds


def clean_shapes(name: str, shapes: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One broker, started afresh: per shape, the pass and the copy baseline."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-cleaner-{name}-"))
    results: dict[str, Any] = {}
    try:
        target = start_target(name, workdir)
        try:
            admin = AdminClient({"bootstrap.servers": target.bootstrap, "log_level": 0})
            warmup(admin, target, SHAPES["100-none-1m"], args.keys)
            for key in shapes:
                topic, shape = f"shape-{key}", SHAPES[key]
                create_topic(admin, topic)
                records = produce_shape(target.bootstrap, topic, shape, args.mib, args.keys)
                logs = sorted((target.data / f"{topic}-0").glob("*.log"))
                if len(logs) < 2:
                    raise RuntimeError(f"{topic}: no segment rolled; raise --mib")
                copied, copy_s = timed_copy(logs[:-1], workdir / "copy")
                if args.profile and not target.kafka:
                    keep_for_profile(logs, workdir / "profile" / topic)
                compact(admin, topic)
                found = target.wait_pass(topic)
                results[key] = {
                    "records": records,
                    "segment_bytes": copied,
                    "pass": asdict(found),
                    "copy_mib_per_s": copied / MIB / copy_s,
                }
                print(
                    f"  {name:12} {shape.label:28} {found.log_bytes / MIB:5.1f} MiB in "
                    f"{found.seconds:5.2f} s: {found.mib_per_s:6.1f} MiB/s (copy "
                    f"{copied / MIB / copy_s:4.0f} MiB/s)",
                    flush=True,
                )
        finally:
            target.stop()
        if args.profile and not target.kafka:  # the broker stopped: a quiet machine
            for key in shapes:
                results[key]["profile"] = profile(workdir / "profile" / f"shape-{key}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def warmup(admin: AdminClient, target: Target, shape: Shape, keys: int) -> None:
    """A first pass: the cleaner's worker process started, the JIT warm."""
    create_topic(admin, "warmup")
    produce_shape(target.bootstrap, "warmup", shape, WARMUP_MIB, keys)
    compact(admin, "warmup")
    target.wait_pass("warmup")


def keep_for_profile(logs: list[Path], into: Path) -> None:
    """Copy the rolled segments with their indexes; note the active segment's base."""
    into.mkdir(parents=True)
    for log in logs[:-1]:
        for suffix in (".log", ".index", ".timeindex"):
            shutil.copy2(log.with_suffix(suffix), into / log.with_suffix(suffix).name)
    (into / "active-base").write_text(logs[-1].stem)


def profile_task(directory: Path) -> CleaningTask:
    """The task the broker plans for a first pass over the copied segments (Kafka's
    defaults; the producer is not idempotent, as librdkafka's default)."""
    logs = sorted(directory.glob("*.log"))
    bases = [int(p.stem) for p in logs] + [int((directory / "active-base").read_text())]
    segments = tuple(
        SegmentToClean(
            base_offset=base,
            path=str(log),
            size=log.stat().st_size,
            next_offset=next_base,
            offset_index_entries=log.with_suffix(".index").stat().st_size // 8,
            time_index_entries=log.with_suffix(".timeindex").stat().st_size // 12,
            mtime_ns=log.stat().st_mtime_ns,
        )
        for base, next_base, log in zip(bases, bases[1:], logs, strict=False)
    )
    return CleaningTask(
        topic_partition=TopicPartition(directory.name, 0),
        directory=str(directory),
        segments=segments,
        first_dirty_offset=0,
        first_uncleanable_offset=bases[-1],
        producer_last_offsets={},
        now_ms=int(time.time() * 1000),
        delete_retention_ms=86_400_000,
        segment_bytes=SEGMENT_BYTES,
        max_index_bytes=10 * MIB,
        index_interval_bytes=4096,
        map_memory_bytes=128 * MIB,
        map_load_factor=0.9,
        io_max_bytes_per_second=float("inf"),
    )


def profile(directory: Path, top: int = 10) -> dict[str, Any]:
    """The pass in this process, timed, then under cProfile: the functions of most own time."""
    task = profile_task(directory)
    stats = clean(task).stats
    rate = stats.bytes_read / MIB / stats.elapsed_s
    profiler = cProfile.Profile()
    profiler.runcall(clean, task)
    rows = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in rows.values())
    heaviest = [
        {"function": f"{Path(file).name}:{line} {name}", "calls": row[1], "own_s": row[2]}
        for (file, line, name), row in sorted(rows.items(), key=lambda kv: -kv[1][2])[:top]
    ]
    print(f"  in process, {directory.name}: {rate:.1f} MiB/s; under cProfile {total:.2f} s:")
    for row in heaviest:
        share = row["own_s"] / total
        print(f"    {share:6.1%} {row['own_s']:6.3f} s {row['calls']:>9} calls  {row['function']}")
    return {"mib_per_s": rate, "profiled_s": total, "heaviest": heaviest}


class LoopProbe:
    """For each `WINDOW_S` of the loop, a line `<unix time> <longest callback, CPU ms>
    <longest callback, wall ms> <a 1 ms timer's latest firing, ms late> <the longest
    callback by CPU>`. CPU time of the loop's thread is the broker's own work; wall time
    also counts the core taken away; the timer is what a request arriving then waits."""

    def __init__(self, out: Path) -> None:
        self.lines = out.open("a", buffering=1)
        self.cpu_s = self.wall_s = self.late_s = 0.0
        self.what = ""
        self.window_ends = time.monotonic() + WINDOW_S
        self.loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        run = asyncio.events.Handle._run
        loop_thread = threading.get_ident()

        def timed_run(handle: asyncio.Handle) -> None:
            if threading.get_ident() != loop_thread:
                return run(handle)
            if (loop := asyncio.get_running_loop()) is not self.loop:  # tick on a new loop
                self.loop = loop
                self._tick(loop.time())
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return run(handle)
            finally:
                self._record(handle, time.thread_time() - cpu, time.perf_counter() - wall)

        asyncio.events.Handle._run = timed_run  # type: ignore[assignment]

    def _tick(self, due: float) -> None:
        assert self.loop is not None
        now = self.loop.time()
        self.late_s = max(self.late_s, now - due)
        self.loop.call_at(now + TICK_S, self._tick, now + TICK_S)

    def _record(self, handle: asyncio.Handle, cpu_s: float, wall_s: float) -> None:
        if cpu_s > self.cpu_s:
            self.cpu_s, self.what = cpu_s, describe(handle)
        self.wall_s = max(self.wall_s, wall_s)
        if time.monotonic() >= self.window_ends:
            self.lines.write(
                f"{time.time():.3f} {self.cpu_s * 1e3:.2f} {self.wall_s * 1e3:.2f} "
                f"{self.late_s * 1e3:.2f} {self.what}\n"
            )
            self.cpu_s = self.wall_s = self.late_s = 0.0
            self.window_ends = time.monotonic() + WINDOW_S


def serve_probed() -> None:
    """`python -c '...serve_probed()' OUT serve ...`: `tierbroker serve` with a LoopProbe."""
    from tierbroker.broker.cli.main import main as cli

    out = Path(sys.argv[1])
    sys.argv = ["tierbroker", *sys.argv[2:]]
    LoopProbe(out).install()
    cli()


def start_probed(workdir: Path, probe: Path) -> Target:
    port = free_port()
    settings = {
        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "log.dirs": str(workdir / "data"),
        "metrics.port": str(free_port()),
        **CLEANER,
        "log.retention.check.interval.ms": "1000",
    }
    launch = "from benchmarks.log_cleaner import serve_probed; serve_probed()"
    command = [sys.executable, "-c", launch, str(probe), "serve"]
    command += ["--config", "config/server.properties"]
    for key, value in settings.items():
        command += ["--override", f"{key}={value}"]
    broker = spawn("tierbroker", command, port, workdir, cwd=ROOT)
    pid = broker.process.pid
    return Target("tierbroker", broker.bootstrap, pid, workdir / "data", broker.log_path,
                  lambda: stop(broker))  # fmt: skip


def stalls(probe: Path, start: float, end: float) -> dict[str, Any]:
    """The worst of the probe's windows that lie within [start, end]."""
    rows = [line.split(" ", 4) for line in probe.read_text().splitlines()]
    inside = [
        (float(late), float(wall), float(cpu), what)
        for t, cpu, wall, late, what in rows
        if start + WINDOW_S <= float(t) <= end
    ]
    if not inside:
        return {"windows": 0}
    worst = max(inside, key=lambda row: row[2])
    return {
        "windows": len(inside),
        "late_ms": max(r[0] for r in inside),
        "wall_ms": max(r[1] for r in inside),
        "cpu_ms": worst[2],
        "what": worst[3],
    }


@dataclass(frozen=True)
class Burst:
    started: float  # unix time
    ended: float
    mib_per_s: float
    broker_cpu_ms_per_mib: float  # the broker process (all its threads)
    cleaner_cpu_ms_per_mib: float  # its child processes: the cleaner's worker
    client_cpu_ms_per_mib: float  # this process: the Python loop and librdkafka


class Bursts:
    """`mib` MiB of 1 KiB values to one topic per burst, from one producer."""

    def __init__(self, bootstrap: str, topic: str, mib: int, broker_pid: int) -> None:
        self.topic = topic
        self.count = mib * MIB // PRODUCE_VALUE_BYTES
        self.value = random.Random(2).randbytes(PRODUCE_VALUE_BYTES)
        self.broker_pid = broker_pid
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
            "batch.size": 1_000_000, "compression.type": "none",
        })  # fmt: skip

    def _cpu_s(self) -> tuple[float, float, float]:
        children = process_tree(self.broker_pid)[1:]
        cleaner = sum(cpu_seconds(pid) for pid in children)
        return cpu_seconds(self.broker_pid), cleaner, time.process_time()

    def run(self) -> Burst:
        cpu, started, wall = self._cpu_s(), time.time(), time.perf_counter()
        for _ in range(self.count):
            while True:
                try:
                    self.producer.produce(self.topic, self.value)
                    break
                except BufferError:
                    self.producer.poll(0.001)
        if self.producer.flush(60) != 0:
            raise RuntimeError(f"{self.topic}: records still undelivered after 60 s")
        seconds, mib = time.perf_counter() - wall, self.count * PRODUCE_VALUE_BYTES / MIB
        used = [
            (after - before) * 1e3 / mib for before, after in zip(cpu, self._cpu_s(), strict=True)
        ]
        return Burst(started, time.time(), mib / seconds, *used)


def under_load(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Produce bursts with and without a pass beside them, and the loop's stalls."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-cleaner-load-"))
    probe = workdir / "probe.txt"
    shape = SHAPES[args.load_shape]
    try:
        target = start_probed(workdir, probe)
        try:
            admin = AdminClient({"bootstrap.servers": target.bootstrap, "log_level": 0})
            warmup(admin, target, shape, args.keys)
            create_topic(admin, "other", OTHER_TOPIC)
            for r in range(args.load_rounds):
                for arm in ("quiet", *cleaning_arms(args)):
                    create_topic(admin, f"{arm}-{r}")
                    produce_shape(target.bootstrap, f"{arm}-{r}", shape, args.load_mib, args.keys)
            bursts = Bursts(target.bootstrap, "other", args.burst_mib, target.pid)
            bursts.run()  # connected, the produce path warm
            rounds = range(args.load_rounds)
            return [load_round(r, args, admin, target, bursts, probe) for r in rounds]
        finally:
            target.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def cleaning_arms(args: argparse.Namespace) -> list[str]:
    return ["cleaning", "reniced"] if args.cleaner_nice else ["cleaning"]


def renice_workers(broker_pid: int, nice: int) -> None:
    """The broker's child processes (its cleaner worker and multiprocessing's resource
    tracker) at `nice`; back to 0 needs root (CAP_SYS_NICE)."""
    for pid in process_tree(broker_pid)[1:]:
        os.setpriority(os.PRIO_PROCESS, pid, nice)


def load_round(
    r: int, args: argparse.Namespace, admin: AdminClient, target: Target, bursts: Bursts,
    probe: Path,
) -> dict[str, Any]:  # fmt: skip
    idle_from = time.time()
    time.sleep(args.idle_s)
    result: dict[str, Any] = {"idle_loop": stalls(probe, idle_from, time.time())}
    asked = time.time()
    compact(admin, f"quiet-{r}")
    quiet = target.wait_pass(f"quiet-{r}")
    time.sleep(0.3)  # the swap and the checkpoint come after the line
    result["quiet_pass"] = asdict(quiet)
    result["cleaning_loop"] = stalls(probe, asked, quiet.ended_at + 0.3)
    arms = ["idle", *cleaning_arms(args)]
    for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:  # each first in turn
        if arm == "idle":
            done = [bursts.run() for _ in range(args.bursts)]
        else:
            renice_workers(target.pid, args.cleaner_nice if arm == "reniced" else 0)
            compact(admin, f"{arm}-{r}")
            done = []
            while (found := target.find_pass(f"{arm}-{r}")) is None:
                done.append(bursts.run())
            renice_workers(target.pid, 0)
            began = found.ended_at - found.seconds
            done = [b for b in done if b.started >= began and b.ended <= found.ended_at]
            result[f"{arm}_pass"] = asdict(found)
            if len(done) < 3:
                print(f"  round {r}: {len(done)} bursts inside the pass: raise --load-mib")
        result[f"produce_{arm}"] = [asdict(b) for b in done]
        if done:
            result[f"produce_{arm}_loop"] = stalls(probe, done[0].started, done[-1].ended)
    return result


def span(values: list[float], fmt: str = ".2f") -> str:
    low, high = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return low if low == high else f"{low}-{high}"


def report_cleaning(results: dict[str, list[dict[str, Any]]], shapes: list[str]) -> None:
    print("\nthe cleaner, MiB of log rewritten per second of pass (medians; ratios per round)")
    print(
        f"{'shape':28} {'records':>8} {'MiB':>5} {'tierbroker':>10} {'copy':>5} {'/copy':>11} "
        f"{'Kafka':>6} {'copy':>5} {'/copy':>11} {'tb/Kafka':>9}"
    )
    for key in shapes:
        cells = []
        for name in ("tierbroker", "apache-kafka"):
            rows = [r[key] for r in results.get(name, [])]
            if rows:
                rates = [r["pass"]["mib_per_s"] for r in rows]
                ratios = [r["pass"]["mib_per_s"] / r["copy_mib_per_s"] for r in rows]
                copy = statistics.median(r["copy_mib_per_s"] for r in rows)
                cells.append(
                    f"{statistics.median(rates):6.1f} {copy:5.0f} {span(ratios, '.3f'):>11}"
                )
        first = results["tierbroker"][0][key]
        line = f"{SHAPES[key].label:28} {first['records']:8} {first['segment_bytes'] / MIB:5.1f} "
        if "apache-kafka" in results:
            pairs = zip(results["tierbroker"], results["apache-kafka"], strict=True)
            versus = [a[key]["pass"]["mib_per_s"] / b[key]["pass"]["mib_per_s"] for a, b in pairs]
            cells.append(f"{span(versus):>9}")
        print(line + "    " + " ".join(cells))


def report_load(rounds: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nproduce to another topic, {args.burst_mib} MiB bursts of 1 KiB values; medians; "
        "CPU ms per MiB produced"
    )
    arms = {"idle": "nothing to clean", "cleaning": "while cleaning"}
    arms |= {"reniced": f"cleaner at nice {args.cleaner_nice}"} if args.cleaner_nice else {}
    for arm, name in arms.items():
        bursts = [b for r in rounds for b in r[f"produce_{arm}"]]
        rates = [b["mib_per_s"] for b in bursts]
        cpu = {k: statistics.median(b[f"{k}_cpu_ms_per_mib"] for b in bursts)
               for k in ("broker", "cleaner", "client")}  # fmt: skip
        line = (
            f"  {name:18} {statistics.median(rates):4.0f} MiB/s ({len(rates)} bursts, "
            f"{min(rates):.0f}-{max(rates):.0f}); CPU broker {cpu['broker']:.2f}, cleaner "
            f"{cpu['cleaner']:.2f}, client {cpu['client']:.2f}"
        )
        if arm != "idle":
            ratios = [
                statistics.median(b["mib_per_s"] for b in r[f"produce_{arm}"])
                / statistics.median(b["mib_per_s"] for b in r["produce_idle"])
                for r in rounds
            ]
            passes = [r[f"{arm}_pass"]["mib_per_s"] for r in rounds]
            line += (
                f"\n  {'':18} ratio to nothing to clean: median {statistics.median(ratios):.2f} "
                f"over {len(ratios)} rounds ({span(ratios)}); the pass {span(passes, '.1f')} MiB/s"
            )
        print(line)
    alone = [r["quiet_pass"]["mib_per_s"] for r in rounds]
    print(f"  the pass with nothing produced: {span(alone, '.1f')} MiB/s")
    print("\nevent loop, worst 100 ms window: timer late / callback wall / callback CPU (ms)")
    loops = {"idle_loop": "idle", "cleaning_loop": "cleaning, no produce"}
    loops |= {f"produce_{arm}_loop": f"produce, {name}" for arm, name in arms.items()}
    for key, name in loops.items():
        rows = [r[key] for r in rounds if r.get(key, {}).get("windows")]
        if rows:
            worst = max(rows, key=lambda s: s["cpu_ms"])["what"][:60]
            columns = [span([s[k] for s in rows], ".1f") for k in ("late_ms", "wall_ms", "cpu_ms")]
            print(f"  {name:36} {columns[0]:>10} {columns[1]:>10} {columns[2]:>10}  ({worst})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB of values per shape")
    parser.add_argument("--keys", type=int, default=5000, help="distinct keys")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=", ".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=1, help="rounds (ABBA)")
    parser.add_argument("--skip-kafka", action="store_true")
    parser.add_argument("--skip-cleaning", action="store_true", help="only produce and stalls")
    parser.add_argument("--skip-load", action="store_true", help="only the cleaner's MiB/s")
    parser.add_argument("--profile", action="store_true", help="cProfile each pass in process")
    parser.add_argument("--load-shape", default="100-none-16k", choices=SHAPES)
    parser.add_argument("--load-mib", type=int, default=32, help="MiB of each topic cleaned")
    parser.add_argument("--load-rounds", type=int, default=4, help="rounds (ABBA)")
    parser.add_argument("--burst-mib", type=int, default=16)
    parser.add_argument("--bursts", type=int, default=16, help="bursts with nothing to clean")
    parser.add_argument("--idle-s", type=float, default=2.0)
    parser.add_argument(
        "--cleaner-nice", type=int, default=0, help="also clean with the worker at this nice"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    results: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}}
    if not args.skip_cleaning:
        names = ["tierbroker"] if args.skip_kafka else ["tierbroker", "apache-kafka"]
        cleaning: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        print(f"cleaner passes: {args.mib} MiB of values per shape over {args.keys} keys")
        for r in range(args.rounds):
            for name in names[:: 1 if r % 2 == 0 else -1]:
                try:
                    cleaning[name].append(clean_shapes(name, shapes, args))
                except TargetUnavailable as e:
                    print(f"  {name} skipped: {e}")
                    names.remove(name)
                    del cleaning[name]
        report_cleaning(cleaning, shapes)
        results["cleaning"] = cleaning
    if not args.skip_load:
        print(f"\nproduce and the event loop beside the cleaner, {args.load_rounds} rounds")
        results["load"] = under_load(args)
        report_load(results["load"], args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
