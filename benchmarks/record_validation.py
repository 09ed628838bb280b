"""What record-level validation costs on produce, measured two ways in one run.

validator: the same pre-built ~1 MB batches (librdkafka's batch size) go through
    `Log.append_as_leader` in this process, into two logs in turn, one append at a
    time: with `validate_records` as shipped and with it replaced by a stub that
    returns the batch's own maxTimestamp; also `validate_records` alone. Reported:
    the median CPU time of one call, per MiB of batches.
end to end: a pre-encoded Produce request (one ~1 MB batch, acks=1, up to 8 in
    flight on one connection) is sent over and over to this tree's broker as shipped
    and to the same broker with `validate_records` stubbed out as above, in turn,
    round after round, each in a fresh temp dir. Reported: MiB/s and the broker's CPU
    seconds per GiB of batches (medians), and the ratios with validation / without.

    python -m benchmarks.record_validation                 # about a minute on 2 cores
    python -m benchmarks.record_validation --mib 100 --repeat 1
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
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cramjam
from confluent_kafka.admin import AdminClient, NewTopic
from crc32c import crc32c
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
    (about 2:1 for the codecs), keys None, timestamps now; LZ4 framed as clients do."""
    count = max(1, BATCH_BYTES // value_size)
    now = time.time_ns() // 1_000_000
    values = []
    for _ in range(count):
        half = os.urandom(value_size // 2)
        values.append((half * 2 + b"x")[:value_size])
    records = [(None, v, [], now) for v in values]
    if compression is Compression.LZ4:
        return client_lz4(build_batch(records))
    return build_batch(records, compression=compression)


def client_lz4(batch: bytes) -> bytes:
    """An uncompressed batch with its records section in an LZ4 frame as the Java client
    and librdkafka write it: 64 KiB independent blocks, no block or content checksums
    (`codecs.compress` writes block checksums, which the broker then checks)."""
    frame = bytearray(b"\x04\x22\x4d\x18\x60\x40\x82")  # magic, FLG, BD, header check
    records = batch[61:]
    for start in range(0, len(records), 64 << 10):
        block = bytes(cramjam.lz4.compress_block(records[start : start + (64 << 10)],
                                                 store_size=False))  # fmt: skip
        frame += struct.pack("<I", len(block)) + block
    out = bytearray(batch[:61]) + frame + bytes(4)  # the end mark
    struct.pack_into(">i", out, 8, len(out) - 12)  # batchLength
    struct.pack_into(">h", out, 21, struct.unpack_from(">h", batch, 21)[0] | Compression.LZ4)
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[21:]))
    return bytes(out)


# Validator, in process ------------------------------------------------------------------


def _own_max_timestamp(view: BatchView, **_: Any) -> int:
    return view.max_timestamp


def time_appends(batch: bytes, mib: int) -> tuple[float, float]:
    """Median CPU seconds per MiB of `Log.append_as_leader` without and with record
    validation (`validate_records` stubbed out, benchmark only), the appends alternating
    between two logs so drift hits both alike. Each append gets a fresh copy of `batch`
    made just before (untimed), as the broker copies a request's records."""
    shipped = log_validator.validate_records
    spent_ns: dict[bool, list[int]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        logs = {
            on: Log(Path(tmp) / f"t-{int(on)}", TopicPartition("t", int(on)), LogConfig(),
                    uuid.uuid4())
            for on in (False, True)
        }  # fmt: skip
        try:
            for round_ in range(max(1, mib * 1024 * 1024 // len(batch))):
                for on in (False, True) if round_ % 2 else (True, False):
                    stub = shipped if on else _own_max_timestamp
                    log_validator.validate_records = stub
                    copy = bytearray(batch)
                    started = time.process_time_ns()
                    logs[on].append_as_leader(copy, 0)
                    spent_ns[on].append(time.process_time_ns() - started)
        finally:
            log_validator.validate_records = shipped
            for log in logs.values():
                log.close()
    mib_per_append = len(batch) / (1 << 20)
    off_s, on_s = (statistics.median(spent_ns[k]) / 1e9 / mib_per_append for k in (False, True))
    return off_s, on_s


def time_walk(batch: bytes, mib: int) -> float:
    """Median CPU seconds per MiB of `validate_records` alone, over `mib` MiB of calls."""
    view = BatchView(bytearray(batch))
    now = time.time_ns() // 1_000_000
    spent_ns = []
    for _ in range(max(1, mib * 1024 * 1024 // len(batch))):
        started = time.process_time_ns()
        validation.validate_records(
            view,
            now_ms=now,
            log_append_time=False,
            timestamp_before_max_ms=2**63 - 1,
            timestamp_after_max_ms=3_600_000,
        )
        spent_ns.append(time.process_time_ns() - started)
    return statistics.median(spent_ns) / 1e9 / (len(batch) / (1 << 20))


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


def produce_requests(port: int, frame: bytes, count: int) -> None:
    """Send `frame` `count` times, at most IN_FLIGHT unanswered; fail on any error code.
    (The broker does not mind a correlation id used again; answers come in order.)"""
    header_reader = entity_reader(ProduceResponse.__header_schema__)
    body_reader = entity_reader(ProduceResponse)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sent = answered = 0
        while answered < count:
            while sent < count and sent - answered < IN_FLIGHT:
                sock.sendall(frame)
                sent += 1
            answer = _read_frame(sock)
            _, offset = header_reader(answer, 0)
            response, _ = body_reader(answer, offset)
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


_STUB = (
    "import tierbroker.storage.log_validator as m; "
    "m.validate_records = lambda v, **_: v.max_timestamp; "
)


def start_broker(workdir: Path, validate: bool) -> Broker:
    """This tree's broker, shipped config, with record validation or with it stubbed out."""
    port = free_port()
    settings = {
        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "log.dirs": str(workdir / "data"),
        "metrics.port": str(free_port()),
    }
    run = (
        f"{'' if validate else _STUB}import sys; sys.argv[0] = 'tierbroker'; "
        "from tierbroker.broker.cli.main import main; main()"
    )
    args = [sys.executable, "-c", run, "serve", "--config", "config/server.properties"]
    for key, value in settings.items():
        args += ["--override", f"{key}={value}"]
    return spawn("on" if validate else "off", args, port, workdir, cwd=ROOT)


def end_to_end(validate: bool, batch: bytes, mib: int) -> tuple[float, float]:
    """(MiB/s, broker CPU s per GiB) for `mib` MiB of Produce requests of `batch`."""
    count = max(IN_FLIGHT, mib * 1024 * 1024 // len(batch))
    frame = encode_produce(batch, 1)
    workdir = Path(tempfile.mkdtemp(prefix="bench-validation-"))
    try:
        broker = start_broker(workdir, validate)
        try:
            create_topic(broker.bootstrap)
            produce_requests(broker.port, frame, IN_FLIGHT)  # warms up
            cpu = cpu_seconds(broker.process.pid)
            started = time.perf_counter()
            produce_requests(broker.port, frame, count)
            seconds = time.perf_counter() - started
            cpu = cpu_seconds(broker.process.pid) - cpu
        finally:
            stop(broker)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    gib = count * len(batch) / (1 << 30)
    return count * len(batch) / (1 << 20) / seconds, cpu / gib


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
    parser.add_argument("--mib", type=int, default=400, help="MiB of batches per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="end-to-end rounds (medians)")
    parser.add_argument("--skip-end-to-end", action="store_true")
    parser.add_argument("--only", help="the cases whose label contains this (e.g. lz4)")
    args = parser.parse_args(argv)
    walker = "compiled" if validation._WALK is not validation.walk_records else "pure Python"
    print(f"record walk: {walker}; batches of about {BATCH_BYTES} bytes\n")
    cases = [case for case in CASES if args.only is None or args.only in label(*case)]
    batches = {case: build_case(*case) for case in cases}

    print("validator, in process (CPU ms per MiB of batches; medians)")
    print(f"{'case':28} {'batch B':>8} {'walk':>7} {'append, off':>12} {'append, on':>11} "
          f"{'on/off':>7}")  # fmt: skip
    for case, batch in batches.items():
        off, on = time_appends(batch, args.mib)
        walk = time_walk(batch, args.mib)
        off, on, walk = off * 1000, on * 1000, walk * 1000
        print(f"{label(*case):28} {len(batch):8} {walk:7.3f} {off:12.3f} {on:11.3f} "
              f"{off / on:6.2f}x")  # fmt: skip
    if args.skip_end_to_end:
        return 0

    print(f"\nend to end: Produce v9, acks=1, {IN_FLIGHT} in flight; validation on vs stubbed out")
    print(f"{'case':28} {'MiB/s off':>10} {'MiB/s on':>9} {'on/off':>7} "
          f"{'CPU s/GiB off':>13} {'on':>6} {'off/on':>7}")  # fmt: skip
    for case, batch in batches.items():
        timed = alternate(
            args.repeat,
            {
                "off": lambda b=batch: end_to_end(False, b, args.mib),
                "on": lambda b=batch: end_to_end(True, b, args.mib),
            },
        )
        off_rate, on_rate, off_cpu, on_cpu = (
            statistics.median(r[i] for r in timed[k])
            for k, i in (("off", 0), ("on", 0), ("off", 1), ("on", 1))
        )
        print(f"{label(*case):28} {off_rate:10.0f} {on_rate:9.0f} {on_rate / off_rate:6.2f}x "
              f"{off_cpu:13.2f} {on_cpu:6.2f} {off_cpu / on_cpu:6.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
