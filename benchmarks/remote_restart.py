"""A broker restart with a long remote history: time until it serves, and its memory.

    python -m benchmarks.remote_restart [--segments 1000 10000 100000 1000000]
        [--partitions 1000] [--baseline REV] [--rounds 3]

A real broker (`tierbroker serve`, the LocalFs tier) is seeded once: a tiered topic of
`--partitions` partitions, partition 0 produced to until its oldest segments are in the
remote tier only, then stopped cleanly (snapshot and checkpoints written). For each N, that
data dir is copied twice and the remote-log metadata snapshot of each copy rewritten with N
more finished remote segments over partitions 1.. (generated metadata: 1,000 offsets each,
a leader change every 100 segments of a partition): once by this tree, once by the baseline
(the tree at `--baseline`, by default the commit before snapshot version 5, laid out as a
wheel installs it), each in its own format. Each broker then starts on its copy and is
measured from its spawn: until it answers ApiVersions (a broker serves only once its remote
tier has started), until a Fetch of partition 0 at offset 0 is answered with records from
the remote tier, and until the remote metadata of every partition it leads is loaded (this
tree logs it; the baseline loads all of it before it serves); resident memory when it
serves and once loaded. Both ways run on the same data in the same invocation, in turn
(ABBA) for `--rounds` rounds, each on a fresh copy of the data; medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.schema.response_header.v1.header import ResponseHeader
from kio.serial import entity_reader

from benchmarks.targets import ROOT, Broker, api_versions_answered, free_port, stop
from benchmarks.tiering import fetch_frame, produce, read_frame, status
from tierbroker.storage.remote.metadata_snapshot import (
    PartitionSnapshot,
    SnapshotState,
    write_snapshot,
)
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierbroker.storage.remote.topic_based_rlmm import SNAPSHOT_FILE
from tierbroker.storage.topic_partition import TopicPartition

MIB = 1 << 20
TOPIC = "history"
SEGMENTS_PER_EPOCH = 100
LOADED = re.compile(r"partitions led or followed here loaded in")  # the loader's last
START_TIMEOUT_S = 300.0
WAYS = ("baseline", "this tree")


def baseline_rev() -> str:
    """The commit before the snapshot's version 5: the code that decoded it all at start."""
    changed = subprocess.run(
        ["git", "log", "-1", "--format=%H", "-S", "SNAPSHOT_VERSION = 4", "--",
         "storage/remote/metadata_snapshot.py"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    return f"{changed}^"


def lay_out(rev: str, directory: Path) -> Path:
    """The tree at `rev` as a wheel lays it out (`tierbroker.<layer>`), with this tree's
    built C extensions (unchanged by the remote metadata); the PYTHONPATH entry."""
    source = directory / "source"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev], cwd=ROOT, check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    package = directory / "path" / "tierbroker"
    shutil.copytree(source / "tierbroker", package)
    for layer in ("protocol", "storage", "rlm", "broker", "pipeline", "testing"):
        shutil.copytree(source / layer, package / layer)
    for built in (ROOT / "protocol" / "records").glob("*.so"):
        shutil.copy(built, package / "protocol" / "records")
    return directory / "path"


def environment(path: Path | None) -> dict[str, str]:
    """The baseline's layout first on the path (ahead of the editable install), or this tree."""
    entries = [str(path)] if path else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*entries, str(ROOT)])}


def start_broker(
    workdir: Path, path: Path | None, overrides: dict[str, str] | None = None
) -> tuple[Broker, float]:
    """`tierbroker serve` with the shipped config on `workdir/data`, from `path`'s tree; it
    and the seconds from spawn to its first ApiVersions answer."""
    port = free_port()
    settings = {
        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "log.dirs": str(workdir / "data"),
        "metrics.port": str(free_port()),
        **(overrides or {}),
    }
    args = [sys.executable, "-c", "from tierbroker.broker.cli.main import main; main()"]
    args += ["serve", "--config", str(ROOT / "config" / "server.properties")]
    for key, value in settings.items():
        args += ["--override", f"{key}={value}"]
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "broker.log"
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=environment(path)
        )
    broker = Broker("tierbroker", process, port, workdir, log_path)
    try:
        until(lambda: api_versions_answered(port), broker, started, "ApiVersions")
    except BaseException:
        stop(broker)
        raise
    return broker, time.perf_counter() - started


def until(condition: Any, broker: Broker, started: float, what: str) -> None:
    while not condition():
        if broker.process.poll() is not None:
            raise RuntimeError(f"the broker exited before {what}:\n{broker.log_tail()}")
        if time.perf_counter() > started + START_TIMEOUT_S:
            raise RuntimeError(f"no {what} in {START_TIMEOUT_S} s:\n{broker.log_tail()}")
        time.sleep(0.01)


def remote_read(port: int) -> bool:
    """A Fetch of partition 0 at offset 0 (in the remote tier only) answered with records."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(fetch_frame(TOPIC, 0, MIB))
            frame = read_frame(s)
    except OSError:
        return False
    _, at = entity_reader(ResponseHeader)(frame, 0)
    response, _ = entity_reader(FetchResponse)(frame, at)
    partition = response.responses[0].partitions[0]
    return partition.error_code == 0 and bool(partition.records)


def seed(workdir: Path, partitions: int) -> None:
    """A tiered topic whose partition 0 has segments in the remote tier only; stopped cleanly."""
    fast = {"remote.log.manager.task.interval.ms": "200", "log.retention.check.interval.ms": "300"}
    metrics = str(free_port())
    broker, _ = start_broker(workdir, None, {**fast, "metrics.port": metrics})
    try:
        config = {
            "remote.storage.enable": "true",
            "segment.bytes": str(MIB),
            "local.retention.bytes": str(MIB),
            "retention.ms": "-1",
        }
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, partitions, 1, config=config)])[TOPIC].result(60)
        produce(broker.bootstrap, TOPIC, 6)
        started = time.perf_counter()
        until(
            lambda: status(metrics, TOPIC).get("local_log_start_offset", 0) > 0,
            broker,
            started,
            "partition 0's oldest segments copied and deleted locally",
        )
    finally:
        stop(broker, timeout_s=60)


def seed_state(data: Path) -> dict[str, Any]:
    """The seeded snapshot, as JSON both trees read (this tree's reader)."""
    from tierbroker.storage.remote.metadata_snapshot import SectionReader, SnapshotFile

    file = SnapshotFile.open(data / SNAPSHOT_FILE)
    try:
        partitions = []
        for section in file.sections:
            segments = SectionReader(file, section).read()
            partitions.append(
                {
                    "segments": [m.to_json() for m, _ in segments],
                    "superseded": [str(m.segment_id.id) for m, s in segments if s],
                    "delete_state": section.delete_state,
                }
            )
        return {"next_offsets": file.next_offsets, "partitions": partitions}
    finally:
        file.close()


def generate(seeded: dict[str, Any], path: Path, count: int, partitions: int) -> None:
    """Write the seeded snapshot with `count` generated finished segments over partitions
    1.., in the format of the tree this process runs."""
    snapshots: list[Any] = []  # PartitionSnapshot, in both trees
    for p in seeded["partitions"]:
        segments = [RemoteLogSegmentMetadata.from_json(s) for s in p["segments"]]
        readable = [m for m in segments if m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
        superseded = {uuid.UUID(s) for s in p["superseded"]}
        tip = segments[0].topic_id_partition
        snapshots.append(
            PartitionSnapshot(
                tip,
                p["delete_state"],
                sorted((m for m in readable if m.segment_id.id not in superseded),
                       key=lambda m: m.start_offset),
                segments,
                superseded,
            )
        )  # fmt: skip
    topic_id = snapshots[0].tip.topic_id
    spread = partitions - 1
    for p in range(1, partitions):
        tip = TopicIdPartition(topic_id, TopicPartition(TOPIC, p))
        made = [
            segment(tip, i) for i in range(count // spread + (1 if p - 1 < count % spread else 0))
        ]
        snapshots.append(PartitionSnapshot(tip, None, made, made, set()))
    offsets = {int(k): v for k, v in seeded["next_offsets"].items()}
    write_snapshot(path, SnapshotState(offsets, snapshots))


def segment(tip: TopicIdPartition, i: int) -> RemoteLogSegmentMetadata:
    start = i * 1000
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(tip),
        start_offset=start,
        end_offset=start + 999,
        max_timestamp_ms=1_700_000_000_000 + i,
        broker_id=0,
        event_timestamp_ms=1_700_000_000_000 + i,
        segment_size_bytes=1 << 20,
        segment_leader_epochs=((i // SEGMENTS_PER_EPOCH, start),),
        state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
    )


def measure(workdir: Path, path: Path | None) -> dict[str, float]:
    broker, serving_s = start_broker(workdir, path)
    started = time.perf_counter() - serving_s
    try:
        until(lambda: remote_read(broker.port), broker, started, "a remote read")
        result = {"serving_s": serving_s, "read_s": time.perf_counter() - started}
        result["serving_rss_mib"] = broker.rss_mib()
        if path is None:
            until(lambda: LOADED.search(log_text(broker)), broker, started, "the loader's end")
        result["loaded_s"] = time.perf_counter() - started if path is None else serving_s
        result["loaded_rss_mib"] = broker.rss_mib()
        return result
    finally:
        stop(broker, timeout_s=120)


def log_text(broker: Broker) -> str:
    return broker.log_path.read_text(errors="replace")


def run(counts: list[int], partitions: int, rev: str, rounds: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="bench-remote-restart-"))
    try:
        baseline = lay_out(rev, directory / "baseline")
        seeded_dir = directory / "seed"
        seed(seeded_dir, partitions)
        seeded = directory / "seed.json"
        seeded.write_text(json.dumps(seed_state(seeded_dir / "data")))
        print(f"baseline: {rev}; {partitions} partitions; median of {rounds} rounds, in turn")
        print("segments | way | serves (s) | remote read (s) | all loaded (s) | "
              "RSS serving (MiB) | RSS loaded (MiB)")  # fmt: skip
        for count in counts:
            results = {}
            for way in WAYS:
                path = baseline if way == "baseline" else None
                generated = directory / f"generated-{way.replace(' ', '-')}"
                shutil.copytree(seeded_dir / "data", generated / "data")
                subprocess.run(
                    [sys.executable, "-m", "benchmarks.remote_restart", "--generate",
                     str(seeded), str(generated / "data" / SNAPSHOT_FILE), str(count),
                     str(partitions)],
                    cwd=generated, env=environment(path), check=True,
                )  # fmt: skip
                results[way] = []
            for i in range(rounds):
                for way in WAYS if i % 2 == 0 else reversed(WAYS):  # ABBA
                    generated = directory / f"generated-{way.replace(' ', '-')}"
                    workdir = directory / "run"
                    shutil.copytree(generated / "data", workdir / "data")  # as generated
                    results[way].append(measure(workdir, baseline if way == "baseline" else None))
                    shutil.rmtree(workdir)
            medians = {way: median_of(rs) for way, rs in results.items()}
            for way, r in medians.items():
                shutil.rmtree(directory / f"generated-{way.replace(' ', '-')}")
                print(
                    f"{count:,} | {way} | {r['serving_s']:.2f} | {r['read_s']:.2f} | "
                    f"{r['loaded_s']:.2f} | {r['serving_rss_mib']:.0f} | {r['loaded_rss_mib']:.0f}"
                )
            old, new = medians["baseline"], medians["this tree"]
            print(
                f"{count:,}: serves {old['serving_s'] / new['serving_s']:.1f}x sooner, "
                f"first remote read {old['read_s'] / new['read_s']:.1f}x sooner, "
                f"RSS serving {old['serving_rss_mib'] / new['serving_rss_mib']:.2f}x less",
                flush=True,
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def median_of(results: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--segments", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000]
    )
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--baseline", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--generate", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        seeded, path, count, partitions = args.generate
        generate(json.loads(Path(seeded).read_text()), Path(path), int(count), int(partitions))
        return
    run(args.segments, args.partitions, args.baseline or baseline_rev(), args.rounds)


if __name__ == "__main__":
    main()
