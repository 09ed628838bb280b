"""Tiered storage measured against its baselines, LocalFs and S3 (moto's server) in one run.

    python -m benchmarks.tiering [--mib 64] [--tiers localfs,s3]

Per tier: produce throughput to a tiered topic (copies running meanwhile) vs an
untiered one, alternating plain, tiered, tiered, plain, four times, into recycled
page cache; tiering MB/s (segments held back with remote.log.copy.disable while
produced, then released and timed from the first one copied to a copy lag of 0) vs
raw writes of the same segment files to the same tier; remote sequential read MB/s
through the broker (a lean Fetch client from offset 0 to the local log start) vs raw
reads of the same objects, each twice in turn, the faster pass counting (the broker
restarted before each, so both read the store, not its chunk cache); time to
first byte of a cold remote fetch (after a restart empties the index cache), inside
a segment (its offset index fetched first) and at a segment's first offset (no index
needed). Beside them, from the broker's cost meter (`/tier/usage`) for the tiered topic:
object-store requests per GB copied and per GB read from the remote tier, and what each
GB costs at the default price table (requests, and the bytes S3 Express bills).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
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
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.serial import entity_reader, entity_writer

from benchmarks.targets import Broker, free_port, start_tierbroker, stop
from tierbroker.broker.cli.prices import (
    DEFAULT_TABLE,
    DEFAULTS,
    GB,
    requests_cost,
    store_transfer_cost,
)
from tierbroker.broker.server.memory import reuse_large_buffers
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import iter_batches

MIB = 1 << 20
TOPIC_CONFIG = {"segment.bytes": str(8 * MIB), "local.retention.bytes": str(16 * MIB)}
FAST = {
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "300",
}
PRODUCE_ORDER = ("plain", "tiered", "tiered", "plain") * 4
MAX_TIMEOUTS = 20  # fetches in a row that outlive remote.fetch.max.wait.ms: give up


class Moto:
    def __init__(self) -> None:
        self.port = free_port()
        exe = Path(sys.executable).with_name("moto_server")
        self.process = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        import boto3

        self.s3 = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.port}",
            region_name="us-east-1",
            aws_access_key_id="t",
            aws_secret_access_key="t",
        )
        self.s3.create_bucket(Bucket="bench")

    def overrides(self) -> dict[str, str]:
        prefix = "rsm.config.storage."
        return {
            "remote.log.storage.manager.class.name": "s3",
            f"{prefix}s3.bucket.name": "bench",
            f"{prefix}s3.region": "us-east-1",
            f"{prefix}s3.endpoint.url": f"http://127.0.0.1:{self.port}",
            f"{prefix}s3.path.style.access.enabled": "true",
            f"{prefix}aws.access.key.id": "t",
            f"{prefix}aws.secret.access.key": "t",
        }

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def status(metrics_port: str, topic: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/tier/status", timeout=5) as r:
        return next((row for row in json.load(r) if row["topic"] == topic), {})


def request_costs(metrics_port: str, topic: str) -> dict[str, float]:
    """Object-store requests per GB written to and read from the remote tier, and USD per GB
    at the default prices (storage, billed by time, left out)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/tier/usage", timeout=5) as r:
        usage = json.load(r)["topics"][topic]
    requests, store = usage["requests"], usage["object_store_bytes"]
    written_gb = store["upload"] / GB
    read_gb = sum(usage["bytes_out"]["remote"].values()) / GB
    writes = {k: requests[k] for k in ("put", "list")}
    table = DEFAULTS[DEFAULT_TABLE]
    written_gb, read_gb = written_gb or float("inf"), read_gb or float("inf")  # none: 0
    return {
        "requests_per_gb_written": sum(writes.values()) / written_gb,
        "requests_per_gb_read": requests["get"] / read_gb,
        "usd_per_gb_written": (
            requests_cost(table, writes) + store_transfer_cost(table, store["upload"], 0)
        )
        / written_gb,
        "usd_per_gb_read": (
            requests_cost(table, {"get": requests["get"]})
            + store_transfer_cost(table, 0, store["download"])
        )
        / read_gb,
    }


def produce(bootstrap: str, topic: str, mib: int) -> float:
    """Seconds to produce `mib` MiB of 1 KiB values, every delivery confirmed."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000, "acks": 1}
    )
    value = os.urandom(1024)
    started = time.perf_counter()
    for _ in range(mib * 1024):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    return time.perf_counter() - started


def fetch_frame(topic: str, offset: int, max_bytes: int) -> bytes:
    """A size-prefixed Fetch v12 for partition 0 of `topic` from `offset`."""
    request = FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=max_bytes,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    buffer = io.BytesIO()
    entity_writer(RequestHeader)(
        buffer,
        RequestHeader(
            request_api_key=1, request_api_version=12, correlation_id=1, client_id="bench"
        ),
    )
    entity_writer(FetchRequest)(buffer, request)
    return struct.pack(">i", buffer.tell()) + buffer.getvalue()


def read_frame(s: socket.socket) -> memoryview:
    """One response, received into its own buffer, which kio parses in place."""
    size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
    view, got = memoryview(bytearray(size)), 0
    while got < size:
        n = s.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("broker closed the connection")
        got += n
    return view.toreadonly()


def read_through_broker(
    port: int, topic: str, end_offset: int, fetch_bytes: int = 8 * MIB
) -> tuple[float, int]:
    """Seconds and record bytes to fetch partition 0 from offset 0 to `end_offset`, one Fetch
    in flight, as a consumer does; batches are walked by their headers, records not decoded."""
    read, offset, timeouts = 0, 0, 0
    with socket.create_connection(("127.0.0.1", port)) as s:
        started = time.perf_counter()
        while offset < end_offset:
            s.sendall(fetch_frame(topic, offset, fetch_bytes))
            frame = read_frame(s)
            _, at = entity_reader(ResponseHeader)(frame, 0)
            response, _ = entity_reader(FetchResponse)(frame, at)
            partition = response.responses[0].partitions[0]
            if partition.error_code == ErrorCode.request_timed_out:
                timeouts += 1  # the remote read goes on and serves the retry, as a consumer's
                if timeouts == MAX_TIMEOUTS:
                    raise RuntimeError(f"fetch at {offset}: {timeouts} timeouts in a row")
                continue
            timeouts = 0
            if partition.error_code != 0:
                raise RuntimeError(f"fetch at {offset}: error {partition.error_code}")
            records = partition.records or b""
            if not records:
                raise RuntimeError(f"fetch at {offset}: no records below offset {end_offset}")
            read += len(records)
            for batch in iter_batches(records):
                offset = batch.last_offset + 1
        return time.perf_counter() - started, read


def fetch_ttfb_ms(port: int, topic: str, offset: int) -> float:
    """One Fetch v12 at `offset`: milliseconds until the response's first bytes."""
    frame = fetch_frame(topic, offset, MIB)
    with socket.create_connection(("127.0.0.1", port)) as s:
        started = time.perf_counter()
        s.sendall(frame)
        s.recv(4)
        return (time.perf_counter() - started) * 1000


def remote_objects(tier: str, workdir: Path, moto: Moto | None) -> list[tuple[str, int]]:
    """The remote segment data objects: LocalFs puts them in <log dir>/remote."""
    if moto is None:
        remote = workdir / "data" / "remote"
        return [(str(p), p.stat().st_size) for p in sorted(remote.rglob("*.log"))]
    listed = moto.s3.list_objects_v2(Bucket="bench").get("Contents", [])
    return [(o["Key"], o["Size"]) for o in listed if o["Key"].endswith(".log")]


def raw_write(objects: list[tuple[str, int]], moto: Moto | None, workdir: Path) -> float:
    """MB/s writing the same segment bytes to the tier directly."""
    data = [
        (
            key,
            (
                Path(key).read_bytes()
                if moto is None
                else moto.s3.get_object(Bucket="bench", Key=key)["Body"].read()
            ),
        )
        for key, _ in objects
    ]
    total = sum(len(d) for _, d in data) / 1e6
    started = time.perf_counter()
    for i, (_, body) in enumerate(data):
        if moto is None:
            target = workdir / "raw" / f"{i}.log"
            target.parent.mkdir(exist_ok=True)
            with open(target, "wb") as f:
                f.write(body)
                os.fsync(f.fileno())
        else:
            moto.s3.put_object(Bucket="bench", Key=f"raw/{i}.log", Body=body)
    return total / (time.perf_counter() - started)


def raw_read(objects: list[tuple[str, int]], moto: Moto | None) -> float:
    """MB/s reading the segment objects whole, directly."""
    started = time.perf_counter()
    for key, size in objects:
        if moto is None:
            data = Path(key).read_bytes()
        else:
            data = moto.s3.get_object(Bucket="bench", Key=key)["Body"].read()
        assert len(data) == size
    return sum(size for _, size in objects) / 1e6 / (time.perf_counter() - started)


def run_tier(tier: str, mib: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-tiering-{tier}-"))
    moto = Moto() if tier == "s3" else None
    metrics = str(free_port())
    overrides = {**FAST, "metrics.port": metrics, **(moto.overrides() if moto else {})}
    broker: Broker | None = None
    try:
        broker = start_tierbroker(workdir, overrides)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        # The untiered topic keeps as much on disk as the tiered one does locally: both
        # delete their oldest segments as they go, and both write into freed pages.
        for topic, tiered, paused, retention in (
            ("plain", "false", "false", TOPIC_CONFIG["local.retention.bytes"]),
            ("tiered", "true", "false", "-1"),
            ("held", "true", "true", "-1"),
        ):
            config = {
                **TOPIC_CONFIG,
                "retention.bytes": retention,
                "remote.storage.enable": tiered,
                "remote.log.copy.disable": paused,
            }
            if paused == "true":  # as Kafka, copies off: local retention must be retention's
                config["local.retention.bytes"] = "-2"
            admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(15)
        # Half the MiB a phase, four times in the order plain, tiered, tiered, plain, so
        # that a drift in the machine's write speed weighs on both alike; the tiered
        # topic's copies run while it is produced and finish before plain goes again.
        # Single phases of either topic vary by a factor of two or more on a small
        # machine: four rounds, not two, so that one draw weighs less on the ratio.
        phases: dict[str, list[float]] = {"plain": [], "tiered": []}
        for topic in PRODUCE_ORDER:
            recycle_page_cache(mib)  # a phase writes its log, and its copies if tiered
            phases[topic].append(produce(broker.bootstrap, topic, mib // 2))
            while status(metrics, "tiered").get("copy_lag_segments", 0) != 0:
                time.sleep(0.05)
        # Tiering MB/s: segments held back while produced, then released and timed alone.
        produce(broker.bootstrap, "held", mib)
        release = ConfigResource(
            "topic",
            "held",
            incremental_configs=[
                ConfigEntry(
                    "remote.log.copy.disable", "false", incremental_operation=AlterConfigOpType.SET
                )
            ],
        )
        # Timed from the first segment seen copied to the last: the wait for the copy
        # task's next run (remote.log.manager.task.interval.ms) is latency, not rate.
        # Each poll costs the broker about 0.2 ms: fine-grained only before the timing.
        recycle_page_cache(mib)
        admin.incremental_alter_configs([release])[release].result(15)
        while (row := status(metrics, "held")).get("remote_bytes", 0) == 0:
            time.sleep(0.005)
        started, first_bytes = time.perf_counter(), row["remote_bytes"]
        while (row := status(metrics, "held")).get("copy_lag_segments", 1) != 0:
            time.sleep(0.02)
        tiering_s = time.perf_counter() - started
        while status(metrics, "tiered")["local_log_start_offset"] == 0:
            time.sleep(0.1)
        local_start = status(metrics, "tiered")["local_log_start_offset"]
        # Reads: each way twice, alternating; the faster pass of each counts, since
        # passes on this machine vary by about 15%.
        objects = remote_objects(tier, workdir, moto)
        remote_read, direct_read = 0.0, 0.0
        written = request_costs(metrics, "tiered")  # this broker's requests: the copies
        for _ in range(2):
            stop(broker)
            broker = start_tierbroker(workdir, overrides)  # nothing cached: the read is cold
            read_s, read_bytes = read_through_broker(broker.port, "tiered", local_start)
            remote_read = max(remote_read, read_bytes / 1e6 / read_s)
            direct_read = max(direct_read, raw_read(objects, moto))
        peak_rss, rss = broker.peak_rss_mib(), broker.rss_mib()
        read = request_costs(metrics, "tiered")  # this broker's: one read pass
        costs = {k: (written if "written" in k else read)[k] for k in written}
        recycle_page_cache(mib)
        direct_write = raw_write(objects, moto, workdir)
        # Each cold fetch after a restart (an empty index cache): at the first segment's
        # first offset, which needs no index, and one past it, which fetches the index.
        stop(broker)
        broker = start_tierbroker(workdir, overrides)
        cold = fetch_ttfb_ms(broker.port, "tiered", 0)
        stop(broker)
        broker = start_tierbroker(workdir, overrides)
        cold_inside = fetch_ttfb_ms(broker.port, "tiered", 1)
        warm = fetch_ttfb_ms(broker.port, "tiered", 1)
        phase_mb = (mib // 2) * MIB / 1e6
        return {
            "produce_tiered_mb_s": phase_mb * len(phases["tiered"]) / sum(phases["tiered"]),
            "produce_plain_mb_s": phase_mb * len(phases["plain"]) / sum(phases["plain"]),
            "produce_tiered_phases_mb_s": [phase_mb / s for s in phases["tiered"]],
            "produce_plain_phases_mb_s": [phase_mb / s for s in phases["plain"]],
            "tiering_mb_s": (row["remote_bytes"] - first_bytes) / 1e6 / tiering_s,
            "raw_write_mb_s": direct_write,
            "remote_read_mb_s": remote_read,
            "raw_read_mb_s": direct_read,
            "cold_fetch_ms": cold,
            "cold_inside_fetch_ms": cold_inside,
            "warm_fetch_ms": warm,
            "peak_rss_mib": peak_rss,
            "rss_mib": rss,
            **costs,
        }
    finally:
        if broker is not None:
            stop(broker)
        if moto is not None:
            moto.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def recycle_page_cache(mib: int) -> None:
    """Write and delete `mib` MiB just before a timed phase, so that it writes into
    pages the kernel has just freed, as a busy broker does.

    A virtual machine may hand free pages back to its host within seconds (free page
    reporting); a page written after that costs as a new one. On the README's machine
    1 GiB took 0.2 s to write into pages freed at once, 0.5 s after 1 s idle, and 2 s
    after 10 s: which kind a phase drew would weigh on whichever side it fell on.
    """
    chunk = bytes(8 * MIB)
    with tempfile.NamedTemporaryFile(prefix="bench-tiering-recycle-") as f:
        for _ in range(mib // 8):
            f.write(chunk)


def main() -> None:
    reuse_large_buffers()  # the client and the raw baseline alike, as the broker does
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--tiers", default="localfs,s3")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {tier: run_tier(tier, args.mib) for tier in args.tiers.split(",")}
    print(f"{'':8} {'measure':34} {'tierbroker':>11} {'baseline':>9} {'ratio':>6} {'goal':>6}")
    for tier, r in results.items():
        rows = [
            (
                "produce MB/s, tiering on vs off",
                r["produce_tiered_mb_s"],
                r["produce_plain_mb_s"],
                0.9,
            ),
            ("tiering MB/s vs raw writes", r["tiering_mb_s"], r["raw_write_mb_s"], 0.8),
            # The goal is against GETs from an object store; LocalFs's raw reads are
            # of the page cache, which no network path comes near.
            (
                "remote read MB/s vs raw reads",
                r["remote_read_mb_s"],
                r["raw_read_mb_s"],
                0.7 if tier == "s3" else None,
            ),
        ]
        for name, ours, base, goal in rows:
            target = "" if goal is None else f"{goal:.2f}"
            print(f"{tier:8} {name:34} {ours:>11.1f} {base:>9.1f} {ours / base:>6.2f} {target:>6}")
        tiered, plain = (
            f"{min(r[k]):.0f}-{max(r[k]):.0f}"
            for k in ("produce_tiered_phases_mb_s", "produce_plain_phases_mb_s")
        )
        print(f"{tier:8} {'produce MB/s, phases on (off)':34} {tiered:>11} {plain:>9}")
        cold, inside, warm = r["cold_fetch_ms"], r["cold_inside_fetch_ms"], r["warm_fetch_ms"]
        print(f"{tier:8} {'cold fetch ms, at a segment start':34} {cold:>11.1f}")
        print(
            f"{tier:8} {'cold fetch ms, inside a segment (warm)':34} {inside:>11.1f} {warm:>9.1f}"
        )
        peak, after = r["peak_rss_mib"], r["rss_mib"]
        print(f"{tier:8} {'broker RSS MiB, peak (after)':34} {peak:>11.0f} {after:>9.0f}")
        written, read = r["requests_per_gb_written"], r["requests_per_gb_read"]
        print(f"{tier:8} {'store requests per GB written (read)':34} {written:>11.0f} {read:>9.0f}")
        written, read = r["usd_per_gb_written"], r["usd_per_gb_read"]
        label = f"USD/GB written (read), {DEFAULT_TABLE}"
        print(f"{tier:8} {label:34} {written:>11.5f} {read:>9.5f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
