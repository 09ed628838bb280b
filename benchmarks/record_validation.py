"""What record-level validation costs on produce, measured two ways in one run.

validator: the same pre-built ~1 MB batches (librdkafka's batch size) go through
    `Log.append_as_leader` in this process, with `validate_records` as shipped and
    with it replaced by a stub that returns the batch's own maxTimestamp, in turn,
    round after round; also `validate_records` alone. Reported per MiB of batches.
end to end: pre-encoded Produce requests (one ~1 MB batch each, acks=1, up to 8 in
    flight on one connection) are sent to this tree's broker and to a broker run
    from the commit before validation (`git archive`), in turn, round after round,
    each in a fresh temp dir. Reported: MiB/s and the broker's CPU seconds per
    GiB of batches, and the ratios this tree / the baseline.

    python -m benchmarks.record_validation                 # about 3 minutes on 2 cores
    python -m benchmarks.record_validation --mib 50 --repeat 1
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v9.response import ProduceResponse
from kio.serial import entity_reader, entity_writer

from benchmarks.targets import ROOT, Broker, free_port, spawn, stop
from tierbroker.protocol.records import BatchView, Compression, build_batch, validation
from tierbroker.storage import log_validator
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_partition import TopicPartition

BATCH_BYTES = 900_000  # of values: with record overheads, under max.message.bytes
IN_FLIGHT = 8
TOPIC = "validation-bench"
CASES = [(100, Compression.NONE), (1024, Compression.NONE), (16384, Compression.NONE),
         (1024, Compression.LZ4), (1024, Compression.ZSTD)]  # fmt: skip


def build_case(value_size: int, compression: Compression) -> bytes:
    """One batch of about BATCH_BYTES of values, each half random, half a repeat of it
    (about 2:1 for the codecs), keys None, timestamps now."""
    count = max(1, BATCH_BYTES // value_size)
    now = time.time_ns() // 1_000_000
    values = []
    for _ in range(count):
        half = os.urandom(value_size // 2)
        values.append((half * 2 + b"x")[:value_size])
    return build_batch([(None, v, [], now) for v in values], compression=compression)


# Validator, in process ------------------------------------------------------------------


def _own_max_timestamp(view: BatchView, **_: Any) -> int:
    return view.max_timestamp


@contextmanager
def record_validation(enabled: bool) -> Iterator[None]:
    """The append path as shipped, or with the record walk stubbed out (benchmark only)."""
    shipped = log_validator.validate_records
    if not enabled:
        log_validator.validate_records = _own_max_timestamp  # type: ignore[assignment]
    try:
        yield
    finally:
        log_validator.validate_records = shipped


def time_appends(batch: bytes, enabled: bool, mib: int) -> float:
    """CPU seconds per MiB of `Log.append_as_leader` over fresh copies of `batch`."""
    rounds = max(1, mib * 1024 * 1024 // len(batch))
    with tempfile.TemporaryDirectory() as tmp, record_validation(enabled):
        log = Log(Path(tmp) / "t-0", TopicPartition("t", 0), LogConfig(), uuid.uuid4())
        copies = [bytearray(batch) for _ in range(rounds)]  # the request buffer is mutable
        started = time.process_time()
        for copy in copies:
            log.append_as_leader(copy, 0)
        spent = time.process_time() - started
        log.close()
    return spent / (rounds * len(batch) / (1 << 20))


def time_walk(batch: bytes, mib: int) -> float:
    """CPU seconds per MiB of `validate_records` alone."""
    rounds = max(1, mib * 1024 * 1024 // len(batch))
    view = BatchView(bytearray(batch))
    now = time.time_ns() // 1_000_000
    started = time.process_time()
    for _ in range(rounds):
        validation.validate_records(
            view,
            now_ms=now,
            log_append_time=False,
            timestamp_before_max_ms=2**63 - 1,
            timestamp_after_max_ms=3_600_000,
        )
    return (time.process_time() - started) / (rounds * len(batch) / (1 << 20))


# End to end -----------------------------------------------------------------------------


def encode_produce(batch: bytes, correlation_id: int, topic: str = TOPIC) -> bytes:
    request = ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            TopicProduceData(
                name=topic, partition_data=(PartitionProduceData(index=0, records=batch),)
            ),
        ),
    )
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


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = sock.recv(n - len(chunks))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            chunks += chunk
        return bytes(chunks)

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def produce_requests(port: int, frames: list[bytes]) -> None:
    """Send every frame, at most IN_FLIGHT unanswered; fail on any error code."""
    header_reader = entity_reader(ProduceResponse.__header_schema__)
    body_reader = entity_reader(ProduceResponse)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sent = answered = 0
        while answered < len(frames):
            while sent < len(frames) and sent - answered < IN_FLIGHT:
                sock.sendall(frames[sent])
                sent += 1
            frame = _read_frame(sock)
            _, offset = header_reader(frame, 0)
            response, _ = body_reader(frame, offset)
            code = response.responses[0].partition_responses[0].error_code
            if code != 0:
                raise RuntimeError(f"produce answered {code!r}")
            answered += 1


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of a process, in nanoseconds from schedstat: clock ticks
    (10 ms) are too coarse for a phase of a few tenths of a CPU second."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(15)


def start_broker(code_dir: Path, workdir: Path) -> Broker:
    """A broker from `code_dir` (its own modules first on the path), shipped config."""
    port = free_port()
    settings = {
        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "log.dirs": str(workdir / "data"),
        "metrics.port": str(free_port()),
    }
    run = (
        f"import sys; sys.path.insert(0, {str(code_dir)!r}); sys.argv[0] = 'tierbroker'; "
        "from broker.cli import main; main()"
    )
    args = [sys.executable, "-c", run, "serve", "--config", "config/server.properties"]
    for key, value in settings.items():
        args += ["--override", f"{key}={value}"]
    return spawn(code_dir.name, args, port, workdir, cwd=code_dir)


def end_to_end(code_dir: Path, batch: bytes, mib: int) -> tuple[float, float]:
    """(MiB/s, broker CPU s per GiB) for `mib` MiB of Produce requests of `batch`."""
    count = max(IN_FLIGHT, mib * 1024 * 1024 // len(batch))
    frames = [encode_produce(batch, i) for i in range(count)]
    workdir = Path(tempfile.mkdtemp(prefix="bench-validation-"))
    try:
        broker = start_broker(code_dir, workdir)
        try:
            create_topic(broker.bootstrap)
            produce_requests(broker.port, frames[:IN_FLIGHT])  # warms up
            cpu = cpu_seconds(broker.process.pid)
            started = time.perf_counter()
            produce_requests(broker.port, frames)
            seconds = time.perf_counter() - started
            cpu = cpu_seconds(broker.process.pid) - cpu
        finally:
            stop(broker)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    gib = count * len(batch) / (1 << 30)
    return count * len(batch) / (1 << 20) / seconds, cpu / gib


def baseline_revision() -> str:
    """The parent of the commit that added record validation."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "protocol/records/validation.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not added:
        raise SystemExit("no commit adds protocol/records/validation.py in this checkout")
    return f"{added[-1]}^"


@contextmanager
def checkout(revision: str) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    try:
        tree = tmp / "baseline"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "archive", revision], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x"], input=archive, cwd=tree, check=True)
        yield tree
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Report ---------------------------------------------------------------------------------


def label(value_size: int, compression: Compression) -> str:
    return f"{value_size} B values, {compression.name.lower()}"


def alternate(repeat: int, runs: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    """Each run once per round, in turn, the order reversed every other round (A B, B A),
    so drift on a shared machine and whatever one run leaves the next hit all alike."""
    results: dict[str, list[Any]] = {name: [] for name in runs}
    for round_ in range(repeat):
        for name, run in list(runs.items())[:: 1 if round_ % 2 == 0 else -1]:
            results[name].append(run())
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=100, help="MiB of batches per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--baseline", help="revision without validation (default: found)")
    parser.add_argument("--skip-end-to-end", action="store_true")
    args = parser.parse_args(argv)
    walker = "compiled" if validation._WALK is not validation.walk_records else "pure Python"
    print(f"record walk: {walker}; batches of about {BATCH_BYTES} bytes\n")
    batches = {case: build_case(*case) for case in CASES}

    print("validator, in process (CPU ms per MiB of batches; medians)")
    print(f"{'case':28} {'batch B':>8} {'walk':>7} {'append, off':>12} {'append, on':>11} "
          f"{'on/off':>7}")  # fmt: skip
    for case, batch in batches.items():
        timed = alternate(
            args.repeat,
            {
                "off": lambda b=batch: time_appends(b, False, args.mib),
                "on": lambda b=batch: time_appends(b, True, args.mib),
                "walk": lambda b=batch: time_walk(b, args.mib),
            },
        )
        off, on, walk = (statistics.median(timed[k]) * 1000 for k in ("off", "on", "walk"))
        print(f"{label(*case):28} {len(batch):8} {walk:7.3f} {off:12.3f} {on:11.3f} "
              f"{off / on:6.2f}x")  # fmt: skip
    if args.skip_end_to_end:
        return 0

    revision = args.baseline or baseline_revision()
    print(f"\nend to end: Produce v9, acks=1, {IN_FLIGHT} in flight; this tree vs {revision}")
    print(f"{'case':28} {'MiB/s base':>10} {'MiB/s now':>10} {'ratio':>6} "
          f"{'CPU s/GiB base':>14} {'now':>6} {'base/now':>8}")  # fmt: skip
    with checkout(revision) as baseline:
        for case in [(100, Compression.NONE), (1024, Compression.NONE), (1024, Compression.ZSTD)]:
            batch = batches[case]
            timed = alternate(
                args.repeat,
                {
                    "base": lambda b=batch: end_to_end(baseline, b, args.mib),
                    "now": lambda b=batch: end_to_end(ROOT, b, args.mib),
                },
            )
            base_rate = statistics.median(r[0] for r in timed["base"])
            now_rate = statistics.median(r[0] for r in timed["now"])
            base_cpu = statistics.median(r[1] for r in timed["base"])
            now_cpu = statistics.median(r[1] for r in timed["now"])
            print(f"{label(*case):28} {base_rate:10.0f} {now_rate:10.0f} "
                  f"{now_rate / base_rate:5.2f}x {base_cpu:14.2f} {now_cpu:6.2f} "
                  f"{base_cpu / now_cpu:7.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
