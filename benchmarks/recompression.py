"""What a topic's compression.type costs on produce: re-encoding batches vs storing them
as produced, measured two ways in one run.

in process: the append path's validation (`validate_batches`) over the same ~1 MB
    batches (1 KiB values, about 2:1 for the codecs), with compression.type=producer
    (stored as produced) and with each codec, in turn, round after round. Reported:
    CPU ms per MiB of batches, the ratio to producer, and how long one batch holds
    the event loop.
end to end: the same pre-encoded Produce requests (one uncompressed batch each,
    acks=1, 8 in flight) to one broker, a topic per compression.type, in turn, round
    after round. Reported: MiB/s and the broker's CPU milliseconds per MiB, and their
    ratios to producer.

    python -m benchmarks.recompression                       # about 2 minutes on 2 cores
    python -m benchmarks.recompression --mib 30 --repeat 1   # quick check
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.record_validation import (
    IN_FLIGHT,
    alternate,
    build_case,
    cpu_seconds,
    encode_produce,
    produce_requests,
)
from benchmarks.targets import start_tierbroker, stop
from tierbroker.protocol.records import Compression
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_validator import validate_batches
from tierbroker.storage.topic_partition import TopicPartition

VALUE_BYTES = 1024
TARGETS = ["producer", "uncompressed", "zstd", "lz4", "gzip", "snappy"]
SOURCES = [Compression.NONE, Compression.LZ4]
END_TO_END_TARGETS = ["producer", "zstd", "lz4", "gzip", "snappy"]
TP = TopicPartition("t", 0)


def time_validation(batch: bytes, compression_type: str, mib: int) -> float:
    """CPU seconds per MiB of `validate_batches` over fresh copies of `batch`."""
    rounds = max(1, mib * 1024 * 1024 // len(batch))
    config = LogConfig(compression_type=compression_type)
    copies = [bytearray(batch) for _ in range(rounds)]  # the request buffer is mutable
    now = time.time_ns() // 1_000_000
    started = time.process_time()
    for copy in copies:
        validate_batches(copy, config, now, TP)
    return (time.process_time() - started) / (rounds * len(batch) / (1 << 20))


def in_process(mib: int, repeat: int) -> None:
    print("in process: validate_batches, CPU ms per MiB of batches (medians)")
    print(f"{'produced as':12} {'batch B':>8} " + " ".join(f"{t:>12}" for t in TARGETS))
    for source in SOURCES:
        batch = build_case(VALUE_BYTES, source)
        timed = alternate(
            repeat, {t: lambda t=t, b=batch: time_validation(b, t, mib) for t in TARGETS}
        )
        ms = {t: statistics.median(timed[t]) * 1000 for t in TARGETS}
        base = ms["producer"]
        cells = " ".join(f"{ms[t]:6.1f} {ms[t] / base:4.1f}x" for t in TARGETS)
        print(f"{source.name.lower():12} {len(batch):8} {cells}")
        held = {t: ms[t] * len(batch) / (1 << 20) for t in TARGETS}
        print(f"{'':12} {'ms/batch':>8} " + " ".join(f"{held[t]:12.1f}" for t in TARGETS))


def end_to_end(mib: int, repeat: int) -> None:
    batch = build_case(VALUE_BYTES, Compression.NONE)
    count = max(IN_FLIGHT, mib * 1024 * 1024 // len(batch))
    sent_mib = count * len(batch) / (1 << 20)
    workdir = Path(tempfile.mkdtemp(prefix="bench-recompression-"))
    try:
        broker = start_tierbroker(workdir)
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
            topics = {t: f"bench-{t}" for t in END_TO_END_TARGETS}
            futures = admin.create_topics(
                [NewTopic(name, 1, 1, config={"compression.type": t}) for t, name in topics.items()]
            )
            for future in futures.values():
                future.result(15)
            frames = {
                t: [encode_produce(batch, i, topic=name) for i in range(count)]
                for t, name in topics.items()
            }
            for t in END_TO_END_TARGETS:
                produce_requests(broker.port, frames[t][:IN_FLIGHT])  # warms up

            def run(target: str) -> tuple[float, float]:
                cpu = cpu_seconds(broker.process.pid)
                started = time.perf_counter()
                produce_requests(broker.port, frames[target])
                seconds = time.perf_counter() - started
                return sent_mib / seconds, (cpu_seconds(broker.process.pid) - cpu) / sent_mib

            timed = alternate(repeat, {t: lambda t=t: run(t) for t in END_TO_END_TARGETS})
        finally:
            stop(broker)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nend to end: Produce v9 of uncompressed ~1 MB batches, acks=1, {IN_FLIGHT} in flight,")
    print(f"{sent_mib:.0f} MiB per topic and round (medians)")
    print(f"{'compression.type':16} {'MiB/s':>7} {'ratio':>6} {'CPU ms/MiB':>10} {'ratio':>6}")
    rates = {t: statistics.median(r[0] for r in timed[t]) for t in END_TO_END_TARGETS}
    cpus = {t: statistics.median(r[1] for r in timed[t]) for t in END_TO_END_TARGETS}
    for t in END_TO_END_TARGETS:
        print(
            f"{t:16} {rates[t]:7.0f} {rates[t] / rates['producer']:5.2f}x "
            f"{cpus[t] * 1000:10.2f} {cpus[t] / cpus['producer']:5.1f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=60, help="MiB of batches per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--skip-end-to-end", action="store_true")
    args = parser.parse_args(argv)
    in_process(args.mib, args.repeat)
    if not args.skip_end_to_end:
        end_to_end(args.mib, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
