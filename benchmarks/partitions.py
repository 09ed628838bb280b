"""Many partitions: CreateTopics time, event-loop stalls, broker RSS; index memory.

    .venv/bin/python -m benchmarks.partitions [--partitions 10000] [--file-limit 1024]
        [--index-entries 262144] [--json OUT]

Broker: started as a user starts it, under a soft RLIMIT_NOFILE of `--file-limit`.
One CreateTopics of N partitions on one connection while a probe connection sends
ApiVersions every 20 ms: the probe's slowest answer is the longest event-loop stall
it saw, against its median answer on the idle broker just before (the baseline).
RSS after the creation and after a clean restart, against the idle broker's RSS
before it. Shutdown time is reported too (it writes a producer snapshot per
partition).

Indexes: an offset and a time index of `--index-entries` entries each (262,144 is a
1 GiB segment at the default index.interval.bytes of 4 KiB), loaded by a lookup;
tracemalloc's count of the heap they keep, against their file bytes, and against the
same entries held as Python int lists (the layout before) in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import resource
import socket
import statistics
import struct
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kio.index import load_payload_module
from kio.serial import entity_writer
from kio.static.constants import EntityType

from benchmarks.targets import Broker, api_versions_answered, start_tierbroker, stop
from tierbroker.storage.indexes import OffsetEntries, OffsetIndex, TimeEntries, TimeIndex

PROBE_INTERVAL_S = 0.02
IDLE_PROBES = 50


def create_topic_request(name: str, partitions: int) -> bytes:
    """A framed CreateTopics v7 request."""
    m = load_payload_module(19, 7, EntityType.request)
    body = m.CreateTopicsRequest(
        topics=(
            m.CreatableTopic(
                name=name,
                num_partitions=partitions,
                replication_factor=1,
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=300),
    )
    header_cls = type(body).__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_cls)(
        buffer,
        header_cls(request_api_key=19, request_api_version=7, correlation_id=1, client_id="bench"),
    )
    entity_writer(type(body))(buffer, body)
    return struct.pack(">i", buffer.tell()) + buffer.getvalue()


def send_and_wait(port: int, frame: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        s.sendall(frame)
        with s.makefile("rb") as f:
            (size,) = struct.unpack(">i", f.read(4))
            f.read(size)


def probe_s(port: int) -> float:
    started = time.perf_counter()
    if not api_versions_answered(port, timeout_s=60):
        raise RuntimeError("the broker did not answer ApiVersions")
    return time.perf_counter() - started


def broker_run(partitions: int, workdir: Path) -> dict[str, float]:
    broker = start_tierbroker(workdir)
    try:
        idle = [probe_s(broker.port) for _ in range(IDLE_PROBES)]
        time.sleep(1)
        rss_idle = broker.rss_mib()
        done = threading.Event()
        probes: list[float] = []

        def probe_until_done() -> None:
            while not done.is_set():
                probes.append(probe_s(broker.port))
                time.sleep(PROBE_INTERVAL_S)

        prober = threading.Thread(target=probe_until_done)
        frame = create_topic_request("many", partitions)
        prober.start()
        started = time.perf_counter()
        send_and_wait(broker.port, frame)
        create_s = time.perf_counter() - started
        done.set()
        prober.join()
        rss_created = broker.rss_mib()
        started = time.perf_counter()
        stop(broker, timeout_s=600)
        shutdown_s = time.perf_counter() - started
    except BaseException:
        stop(broker)
        raise
    restarted: Broker = start_tierbroker(workdir)
    try:
        time.sleep(1)
        rss_restarted = restarted.rss_mib()
        restart_s = restarted.startup_s
    finally:
        stop(restarted, timeout_s=600)
    return {
        "partitions": partitions,
        "create_s": create_s,
        "probe_idle_median_ms": statistics.median(idle) * 1000,
        "probe_max_during_create_ms": max(probes) * 1000,
        "probe_p99_during_create_ms": (
            statistics.quantiles(probes, n=100)[98] if len(probes) > 1 else probes[0]
        )
        * 1000,
        "probes_during_create": len(probes),
        "rss_idle_mib": rss_idle,
        "rss_created_mib": rss_created,
        "rss_restarted_mib": rss_restarted,
        "shutdown_s": shutdown_s,
        "restart_s": restart_s,
    }


def kept_heap_bytes(build: Any) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def index_run(entries: int, workdir: Path) -> dict[str, float]:
    offsets, times = OffsetEntries(b"", 0), TimeEntries(b"", 0)
    offset_path, time_path = workdir / "0.index", workdir / "0.timeindex"
    offset_path.write_bytes(b"".join(offsets.encode(7 * i, 4096 * i) for i in range(entries)))
    time_path.write_bytes(b"".join(times.encode(1_000 + i, 7 * i) for i in range(entries)))
    file_bytes = offset_path.stat().st_size + time_path.stat().st_size

    def load() -> tuple[OffsetIndex, TimeIndex]:
        offset_index = OffsetIndex(offset_path, 0, 1 << 30)
        time_index = TimeIndex(time_path, 0, 1 << 30)
        offset_index.lookup(7 * entries // 2)
        time_index.lookup(1_000 + entries // 2)
        return offset_index, time_index

    def as_lists() -> list[list[int]]:
        lists: list[list[int]] = [[], [], [], []]
        for a, b in OffsetEntries.entry.iter_unpack(offset_path.read_bytes()):
            lists[0].append(a)
            lists[1].append(b)
        for a, b in TimeEntries.entry.iter_unpack(time_path.read_bytes()):
            lists[2].append(a)
            lists[3].append(b)
        return lists

    heap, _ = kept_heap_bytes(load)
    lists_heap, _ = kept_heap_bytes(as_lists)
    opened, _ = kept_heap_bytes(
        lambda: (OffsetIndex(offset_path, 0, 1 << 30), TimeIndex(time_path, 0, 1 << 30))
    )
    return {
        "entries": entries,
        "index_file_bytes": file_bytes,
        "heap_bytes": heap,
        "heap_before_lookup_bytes": opened,
        "int_lists_heap_bytes": lists_heap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--file-limit", type=int, default=1024)
    parser.add_argument("--index-entries", type=int, default=262_144)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and args.file_limit > hard:
        parser.error(f"--file-limit {args.file_limit} is above the hard limit {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.file_limit, hard))  # the broker inherits
    with tempfile.TemporaryDirectory() as tmp:
        index = index_run(args.index_entries, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        broker = broker_run(args.partitions, Path(tmp))
    mib = 1 << 20
    print(f"indexes of {index['entries']} entries each: {index['index_file_bytes'] / mib:.1f} MiB")
    print(
        f"  heap after a lookup {index['heap_bytes'] / mib:.2f} MiB "
        f"({index['heap_bytes'] / index['index_file_bytes']:.2f}x the file bytes); "
        f"as int lists {index['int_lists_heap_bytes'] / mib:.1f} MiB "
        f"({index['int_lists_heap_bytes'] / index['heap_bytes']:.1f}x more); "
        f"before any lookup {index['heap_before_lookup_bytes']} bytes"
    )
    print(
        f"CreateTopics of {broker['partitions']} partitions under RLIMIT_NOFILE "
        f"{args.file_limit}: {broker['create_s']:.1f} s"
    )
    print(
        f"  probe ApiVersions: idle median {broker['probe_idle_median_ms']:.1f} ms, "
        f"slowest during the creation {broker['probe_max_during_create_ms']:.0f} ms "
        f"({broker['probe_max_during_create_ms'] / broker['probe_idle_median_ms']:.0f}x), "
        f"p99 {broker['probe_p99_during_create_ms']:.0f} ms, "
        f"{broker['probes_during_create']} probes"
    )
    print(
        f"  RSS: idle {broker['rss_idle_mib']:.0f} MiB, created {broker['rss_created_mib']:.0f} "
        f"MiB ({broker['rss_created_mib'] / broker['rss_idle_mib']:.2f}x), after a restart "
        f"{broker['rss_restarted_mib']:.0f} MiB "
        f"({broker['rss_restarted_mib'] / broker['rss_idle_mib']:.2f}x)"
    )
    print(f"  clean shutdown {broker['shutdown_s']:.1f} s, restart {broker['restart_s']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"index": index, "broker": broker}, indent=2))


if __name__ == "__main__":
    main()
