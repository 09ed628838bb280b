"""Cold reads of the remote tier through the broker, against raw ranged-GET sweeps of the
same objects from the same endpoint, in one run.

    python -m benchmarks.cold_read [--mib 256] [--latencies 0,10,50] [--rounds 2]

The endpoint is moto's S3 server, each request answered `latency` ms later (an object
store's round trip; concurrent requests wait together). Per latency, one broker (the S3
plugin, the chunk layer's defaults: 4 MiB chunks, 16 MiB prefetch, ten reader threads)
holds MIB MiB of one partition in the remote tier only (8 MiB segments of 1 KiB records).
Every timed read follows a restart with the index cache removed, so nothing is cached:

- one consumer: a lean Fetch client from offset 0 to the remote tier's end, one Fetch of
  1 MiB in flight (the stock clients' max.partition.fetch.bytes), batches walked by their
  headers; MB/s of record bytes;
- the raw sweep: ranged GETs of 4 MiB over the same objects in order, ten at once (as many
  as the broker's reader threads), from the same endpoint; the goal is the broker at 0.8x
  of it or more. Also one GET at a time of whole objects, the simplest reader;
- first byte: a Fetch in the middle of each segment (its offset index fetched first), last
  segment first, so that no fetch finds what an earlier one prefetched; p50 and p99;
- ten consumers reading from offset 0 at once: their MB/s together, and the GETs of the
  segments' data per chunk, from the endpoint's own request log (1.00: each chunk once);
- the requests one consumer's read cost the store, per GB read (the endpoint's log).

Rounds alternate the broker and the sweeps; the best of each counts. CPU milliseconds
per MB read of the broker and of moto's server (and moto's in the sweep) show where a
run's two cores went.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.targets import Broker, free_port, process_cpu_seconds, start_tierbroker, stop
from benchmarks.tiering import fetch_ttfb_ms, produce, read_through_broker, status
from tests.integration.moto_server import MotoServer
from tierbroker.broker.server.memory import reuse_large_buffers

MIB = 1 << 20
CHUNK = 4 * MIB
READERS = 10
BUCKET = "bench"
TOPIC = "history"


def start(workdir: Path, overrides: dict[str, str]) -> Broker:
    """A broker with nothing cached: the index cache's files removed before it starts."""
    shutil.rmtree(workdir / "data" / "remote-log-index-cache", ignore_errors=True)
    return start_tierbroker(workdir, overrides)


def raw_sweep(s3: Any, objects: list[tuple[str, int]], parallel: int) -> float:
    """MB/s getting every object in CHUNK ranges, in order, `parallel` at a time."""
    ranges = [
        (key, at, min(at + CHUNK, size)) for key, size in objects for at in range(0, size, CHUNK)
    ]

    def get(r: tuple[str, int, int]) -> int:
        key, start, end = r
        body = s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
        return len(body.read())

    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        got = sum(pool.map(get, ranges))
    assert got == sum(size for _, size in objects)
    return got / 1e6 / (time.perf_counter() - started)


def whole_objects(s3: Any, objects: list[tuple[str, int]]) -> float:
    """MB/s getting every object whole, one at a time."""
    started = time.perf_counter()
    got = sum(len(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()) for key, _ in objects)
    return got / 1e6 / (time.perf_counter() - started)


def run_latency(latency_ms: int, mib: int, rounds: int, settings: dict[str, str]) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cold-read-"))
    moto = MotoServer(latency_ms=latency_ms).start()
    moto.create_bucket(BUCKET)
    metrics = str(free_port())
    overrides = {
        **moto.rsm_overrides(BUCKET),
        "metrics.port": metrics,
        "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "300",
        **settings,
    }
    broker = start(workdir, overrides)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(8 * MIB),
            "local.retention.bytes": str(8 * MIB),
        }
        admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(15)
        produce(broker.bootstrap, TOPIC, mib)
        while not (
            (row := status(metrics, TOPIC)).get("copy_lag_segments") == 0
            and row.get("local_log_start_offset", 0) >= (mib - 16) * 1024
        ):
            time.sleep(0.1)
        remote_end = row["local_log_start_offset"]
        s3 = moto.client()
        listed = s3.list_objects_v2(Bucket=BUCKET)["Contents"]
        objects = sorted((o["Key"], o["Size"]) for o in listed if o["Key"].endswith(".log"))
        starts = sorted(int(Path(key).name[:20]) for key, _ in objects)
        remote_bytes = sum(size for _, size in objects)

        through, sweep, whole, requests_per_gb = 0.0, 0.0, 0.0, 0.0
        broker_cpu, moto_cpu, sweep_moto_cpu = [], [], []
        assert moto.process is not None
        for _ in range(rounds):
            stop(broker)
            broker = start(workdir, overrides)
            asked = len(moto.requests())
            cpu = process_cpu_seconds(broker.process.pid), process_cpu_seconds(moto.process.pid)
            seconds, read = read_through_broker(broker.port, TOPIC, remote_end, MIB)
            broker_cpu.append(
                (process_cpu_seconds(broker.process.pid) - cpu[0]) * 1e3 / (read / 1e6)
            )
            moto_cpu.append((process_cpu_seconds(moto.process.pid) - cpu[1]) * 1e3 / (read / 1e6))
            through = max(through, read / 1e6 / seconds)
            requests_per_gb = (len(moto.requests()) - asked) / (read / 1e9)
            before = process_cpu_seconds(moto.process.pid)
            sweep = max(sweep, raw_sweep(s3, objects, READERS))
            sweep_moto_cpu.append(
                (process_cpu_seconds(moto.process.pid) - before) * 1e3 / (remote_bytes / 1e6)
            )
            whole = max(whole, whole_objects(s3, objects))

        stop(broker)
        broker = start(workdir, overrides)
        ends = [*starts[1:], remote_end]
        first_bytes = [
            fetch_ttfb_ms(broker.port, TOPIC, (s + e) // 2)
            for s, e in reversed(list(zip(starts, ends, strict=True)))
        ]

        stop(broker)
        broker = start(workdir, overrides)
        asked = len(moto.requests())
        results: list[tuple[float, int]] = []

        def consume() -> None:
            results.append(read_through_broker(broker.port, TOPIC, remote_end, MIB))

        threads = [threading.Thread(target=consume) for _ in range(READERS)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        together = sum(r for _, r in results) / 1e6 / (time.perf_counter() - started)
        gets = sum(1 for m, p in moto.requests()[asked:] if m == "GET" and p.endswith(".log"))
        chunks = sum(-(-size // CHUNK) for _, size in objects)
        return {
            "latency_ms": latency_ms,
            "remote_mb": remote_bytes / 1e6,
            "broker_mb_s": through,
            "sweep_mb_s": sweep,
            "whole_objects_mb_s": whole,
            "first_byte_p50_ms": statistics.median(first_bytes),
            "first_byte_p99_ms": statistics.quantiles(first_bytes, n=100)[98],
            "first_byte_samples": len(first_bytes),
            "ten_consumers_mb_s": together,
            "gets_per_chunk": gets / chunks,
            "requests_per_gb_read": requests_per_gb,
            "broker_cpu_ms_per_mb": min(broker_cpu),
            "moto_cpu_ms_per_mb": min(moto_cpu),
            "sweep_moto_cpu_ms_per_mb": min(sweep_moto_cpu),
        }
    finally:
        stop(broker)
        moto.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    reuse_large_buffers()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--latencies", default="0,10,50")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--override", action="append", default=[], help="a broker property, key=value"
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    settings = dict(o.split("=", 1) for o in args.override)
    results = [
        run_latency(int(latency), args.mib, args.rounds, settings)
        for latency in args.latencies.split(",")
    ]
    print(
        f"{'latency':>8} {'broker MB/s':>12} {'sweep MB/s':>11} {'ratio':>6} {'whole MB/s':>11} "
        f"{'first byte p50/p99 ms':>22} {'10 consumers MB/s':>18} {'GETs/chunk':>11} "
        f"{'requests/GB':>12} {'CPU ms/MB: broker, moto (sweep)':>32}"
    )
    for r in results:
        print(
            f"{r['latency_ms']:>6}ms {r['broker_mb_s']:>12.0f} {r['sweep_mb_s']:>11.0f} "
            f"{r['broker_mb_s'] / r['sweep_mb_s']:>6.2f} {r['whole_objects_mb_s']:>11.0f} "
            f"{r['first_byte_p50_ms']:>10.0f} / {r['first_byte_p99_ms']:<9.0f} "
            f"{r['ten_consumers_mb_s']:>18.0f} {r['gets_per_chunk']:>11.2f} "
            f"{r['requests_per_gb_read']:>12.0f} {r['broker_cpu_ms_per_mb']:>14.2f}, "
            f"{r['moto_cpu_ms_per_mb']:.2f} ({r['sweep_moto_cpu_ms_per_mb']:.2f})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
