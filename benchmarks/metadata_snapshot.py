"""Remote metadata at scale: memory per segment, snapshot and restart, event-loop stalls.

    python -m benchmarks.metadata_snapshot [--segments 100000 1000000] [--partitions 1000]

For each N, N finished remote segments over `--partitions` partitions are put into
a `TopicBasedRemoteLogMetadataManager`, as the copy tasks put them. Then, while a
probe on the event loop sleeps 1 ms at a time and records how late each wake-up is:

- snapshot write: `snapshot()` (the state copied on the loop; encoded, written and
  fsynced in the executor) against the baseline, the JSON snapshot this tree wrote
  before, built, serialised and written inside one call on the loop;
- restart: a new manager's `start()` (the snapshot's section headers read, then
  `--events` events after it replayed from the metadata topic, each waiting for its
  partition), then every partition assigned, as a broker leading them all does, and
  loaded by the manager's loader a chunk per turn or by its readiness check, each
  asked in a turn of its own as each partition's tiering asks; each in a fresh interpreter so its
  resident memory is its own, against the baseline, the JSON snapshot parsed whole and
  restored in one call on the loop, as `start()` did before. "start" is the time until
  `start()` returned: a broker serves from then on.

Both ways run in the same invocation on the same segments. The probe alone (an idle
second) gives the machine's noise floor. Prints, per way, the longest and p99 stall
and the wall time; resident memory per segment (RSS growth over N: live, and after
each restart) and the peak RSS growth during each restart; the snapshot's bytes per
segment; the read paths' cost per call, which must not grow with N; and, first and in
the same invocation, the longest stall while N segments are put into a cache that freezes
them in batches against one that does not (CPython's own full collections as they grow).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from tierbroker.storage.checkpoints import write_atomically
from tierbroker.storage.long_lived import freeze_heap_in_this_process
from tierbroker.storage.remote.metadata_cache import FREEZE_EVERY_SEGMENTS, RemoteLogMetadataCache
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager
from tierbroker.storage.topic_partition import TopicPartition

PROBE_INTERVAL_S = 0.001
JSON_SNAPSHOT = "baseline.json"
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


class EventsTopic:
    """The metadata topic, one partition holding `events` (none: the benchmark fills the
    cache directly), as the restarted manager replays them."""

    num_partitions = 1

    def __init__(self, events: list[bytes] | None = None) -> None:
        self.events = events or []

    async def ensure_created(self) -> None:
        pass

    async def append(self, partition: int, key: bytes, value: bytes) -> int:
        raise NotImplementedError

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        for offset in range(start_offset, len(self.events)):
            yield offset, b"", self.events[offset]

    async def fetch(
        self, partition: int, start_offset: int
    ) -> tuple[list[tuple[int, bytes, bytes | None]], int]:
        return list(self.read(partition, start_offset)), len(self.events)

    def follow(self, on_records: Callable[[int], None]) -> None:
        pass

    async def close(self) -> None:
        pass


def rss_kib(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def tips(partitions: int) -> list[TopicIdPartition]:
    rng = random.Random(7)
    return [
        TopicIdPartition(uuid.UUID(int=rng.getrandbits(128)), TopicPartition("bench", p))
        for p in range(partitions)
    ]


BASE_OFFSET = 1_000_000_000
SEGMENTS_PER_EPOCH = 100  # a partition's leader changes every 100 segments


def epoch_of(offset: int) -> int:
    return (offset - BASE_OFFSET) // 1000 // SEGMENTS_PER_EPOCH


def segment(tip: TopicIdPartition, start: int, i: int, state: RemoteLogSegmentState) -> Any:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(tip),
        start_offset=start,
        end_offset=start + 999,
        max_timestamp_ms=1_700_000_000_000 + i,
        broker_id=0,
        event_timestamp_ms=1_700_000_000_000 + i,
        segment_size_bytes=1 << 20,
        segment_leader_epochs=((epoch_of(start), start),),
        state=state,
    )


def build(rlmm: TopicBasedRemoteLogMetadataManager, count: int, partitions: int) -> None:
    all_tips = tips(partitions)
    for i in range(count):
        start = BASE_OFFSET + (i // partitions) * 1000
        rlmm.cache.put(segment(all_tips[i % partitions], start, i, FINISHED))
    rlmm.next_offsets = {0: 0}


def put_stalls(count: int, partitions: int, freeze_every: int) -> dict[str, float]:
    """Put `count` segments into a fresh cache as copies do (started, then finished), with
    the heap frozen every `freeze_every` segment states: the longest pair of puts (a
    collection the growth set off included) and a full collection afterwards, in ms."""
    cache = RemoteLogMetadataCache(freeze_every)
    all_tips = tips(partitions)
    gc.collect()
    longest = 0.0
    for i in range(count):
        start = BASE_OFFSET + (i // partitions) * 1000
        started = segment(all_tips[i % partitions], start, i, RemoteLogSegmentState(0))
        began = time.perf_counter()
        cache.put(started)
        cache.put(started.with_state(FINISHED, 1))
        longest = max(longest, time.perf_counter() - began)
    return {"longest_put": longest * 1000, "gc": full_collection_ms()}


def later_events(count: int, segments: int, partitions: int) -> list[bytes]:
    """`count` events after the snapshot: new segments' copies, started then finished."""
    all_tips, events = tips(partitions), []
    for i in range(count // 2):
        start = BASE_OFFSET + (segments // partitions + 1 + i // partitions) * 1000
        started = segment(all_tips[i % partitions], start, i, RemoteLogSegmentState(0))
        for m in (started, started.with_state(FINISHED, 1)):
            events.append(json.dumps({"type": "segment", "metadata": m.to_json()}).encode())
    return events


def json_snapshot_on_the_loop(rlmm: TopicBasedRemoteLogMetadataManager, path: Path) -> None:
    """The baseline write: the snapshot as this tree wrote it before (JSON, version 2),
    all inside one call on the event loop."""
    cache = rlmm.cache
    document = {
        "version": 2,
        "next_offsets": {str(p): o for p, o in rlmm.next_offsets.items()},
        "segments": [m.to_json() for tip in cache.partitions() for m in cache.all_segments(tip)],
        "superseded": [],
        "partition_deletes": [],
    }
    write_atomically(path, json.dumps(document))


def json_restart_on_the_loop(rlmm: TopicBasedRemoteLogMetadataManager, path: Path) -> None:
    """The baseline restart: the JSON snapshot parsed whole and restored in one call on
    the loop, then every event after it, as `start()` did before."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rlmm.next_offsets = {int(p): o for p, o in data["next_offsets"].items()}
    for d in data["segments"]:
        rlmm.cache.restore(RemoteLogSegmentMetadata.from_json(d), False)
    rlmm.replayed_events = rlmm.catch_up(0)


async def probed(work: Callable[[], Awaitable[None]]) -> dict[str, float]:
    """Longest and p99 stall and wall time (ms) of the loop while `work` runs, and the
    most CPU the loop's thread used between two wake-ups of the probe: the longest piece
    of work the loop ran, which the machine's other load does not lengthen."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    busy: list[float] = []
    done = False

    async def probe() -> None:
        while not done:
            expected = loop.time() + PROBE_INTERVAL_S
            cpu = time.thread_time()
            await asyncio.sleep(PROBE_INTERVAL_S)
            lags.append(max(loop.time() - expected, 0.0))
            busy.append(time.thread_time() - cpu)

    task = loop.create_task(probe())
    await asyncio.sleep(0.05)
    lags.clear()
    busy.clear()
    started = time.perf_counter()
    await work()
    wall = time.perf_counter() - started
    await asyncio.sleep(0.05)
    done = True
    await task
    lags.sort()
    return {
        "longest": lags[-1] * 1000,
        "p99": lags[int(len(lags) * 0.99)] * 1000,
        "wall": wall * 1000,
        "cpu": max(busy) * 1000,
    }


async def restart_child(
    way: str, directory: Path, segments: int, events: int, partitions: int
) -> None:
    """In a fresh interpreter: restart one way, print its stalls and memory as JSON."""
    topic = EventsTopic(later_events(events, segments, partitions))
    gc.collect()
    base_kib = rss_kib()
    rlmm = TopicBasedRemoteLogMetadataManager(topic, directory)

    started = time.perf_counter()
    start_s = 0.0

    async def restart() -> None:
        nonlocal start_s
        if way == "new":
            await rlmm.start()
            start_s = time.perf_counter() - started
            everything = rlmm.partitions()
            rlmm.on_partition_leadership_changes(everything, [])
            for tip in everything:  # as each partition's tiering asks, in a turn of its own
                while True:
                    if rlmm.is_ready(tip):
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0)
        else:
            json_restart_on_the_loop(rlmm, directory / JSON_SNAPSHOT)
            start_s = time.perf_counter() - started

    result = await probed(restart)
    result["start"] = start_s * 1000
    gc.collect()
    restored = sum(rlmm.cache.segment_count(t) for t in rlmm.partitions())
    assert restored == segments + events // 2, f"restored {restored} segments"
    assert rlmm.replayed_events == events
    await rlmm.abandon()  # its loader stopped; the snapshot left as it was
    result["rss_bytes"] = (rss_kib() - base_kib) * 1024
    result["peak_bytes"] = (rss_kib("VmHWM") - base_kib) * 1024
    result["gc"] = full_collection_ms()
    print(json.dumps(result))


def full_collection_ms() -> float:
    """How long a full collection of the cyclic garbage collector stops the loop, once
    the first after the build is done."""
    gc.collect()
    started = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - started) * 1000


def restart_in_child(
    way: str, directory: Path, n: int, events: int, partitions: int
) -> dict[str, float]:
    args = [sys.executable, "-m", "benchmarks.metadata_snapshot", "--child", way, str(directory)]
    args += ["--segments", str(n), "--events", str(events), "--partitions", str(partitions)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.splitlines()[-1]))


def read_path_us(
    rlmm: TopicBasedRemoteLogMetadataManager, n: int, partitions: int
) -> dict[str, float]:
    """Microseconds per call of the read paths a fetch or a metric takes, at random."""
    rng = random.Random(1)
    all_tips = rlmm.partitions()
    top = BASE_OFFSET + (n // partitions) * 1000
    calls = [(rng.choice(all_tips), rng.randrange(BASE_OFFSET, top)) for _ in range(20_000)]
    timed = {
        "segment for offset": lambda t, o: rlmm.remote_log_segment_metadata(t, epoch_of(o), o),
        "remote_log_size": lambda t, o: rlmm.remote_log_size(t, 6),
        "highest offset for epoch": lambda t, o: rlmm.highest_offset_for_epoch(t, 3),
    }
    result = {}
    for name, call in timed.items():
        started = time.perf_counter()
        for t, o in calls:
            call(t, o)
        result[name] = (time.perf_counter() - started) / len(calls) * 1e6
    return result


async def run(n: int, partitions: int, events: int) -> None:
    # The baseline first, and alone: what it puts is freed before the frozen way runs.
    puts = {
        "not frozen": put_stalls(n, partitions, freeze_every=2 * n + 1),
        f"frozen every {FREEZE_EVERY_SEGMENTS:,}": put_stalls(n, partitions, FREEZE_EVERY_SEGMENTS),
    }
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        rlmm = TopicBasedRemoteLogMetadataManager(EventsTopic(), directory)
        await rlmm.start()
        gc.collect()
        before = rss_kib()
        build(rlmm, n, partitions)
        gc.collect()
        live = (rss_kib() - before) * 1024 / n
        live_gc = full_collection_ms()

        async def idle() -> None:
            await asyncio.sleep(1.0)

        async def json_write() -> None:
            json_snapshot_on_the_loop(rlmm, directory / JSON_SNAPSHOT)

        writes = {"idle": await probed(idle), "JSON on the loop": await probed(json_write)}
        writes["executor"] = await probed(rlmm.snapshot)
        sizes = {
            "JSON": (directory / JSON_SNAPSHOT).stat().st_size / n,
            "binary": rlmm.snapshot_path.stat().st_size / n,
        }
        reads = read_path_us(rlmm, n, partitions)
        restarts = {
            "JSON on the loop": restart_in_child("json", directory, n, events, partitions),
            "sections": restart_in_child("new", directory, n, events, partitions),
        }

    print(f"\n{n:,} remote segments over {partitions:,} partitions, {events:,} events to replay")
    print(f"resident memory: {live:.0f} bytes/segment live (RSS growth over N)")
    print(
        f"a full gc.collect(): {live_gc:.0f} ms with the segments put live, "
        + ", ".join(f"{r['gc']:.0f} ms after a restart {k}" for k, r in restarts.items())
    )
    print(
        "putting N segments (started, then finished): "
        + ", ".join(
            f"{k}: longest put {r['longest_put']:.0f} ms, then a full collection {r['gc']:.0f} ms"
            for k, r in puts.items()
        )
    )
    print(f"snapshot: {sizes['JSON']:.0f} bytes/segment as JSON, {sizes['binary']:.0f} binary")
    print(
        "{:>24} {:>11} {:>7} {:>12} {:>8} {:>10} {:>11}".format(
            "", "longest ms", "p99 ms", "loop CPU ms", "wall ms", "RSS B/seg", "peak B/seg"
        )
    )
    for name, r in [(f"write, {k}", v) for k, v in writes.items()] + [
        (f"restart, {k}", v) for k, v in restarts.items()
    ]:
        memory = (
            f" {r['rss_bytes'] / n:>10.0f} {r['peak_bytes'] / n:>11.0f}" if "rss_bytes" in r else ""
        )
        print(
            f"{name:>24} {r['longest']:>11.1f} {r['p99']:>7.1f} {r['cpu']:>12.1f}"
            f" {r['wall']:>8.0f}{memory}"
        )
    print(
        "restart, until start() returned (a broker serves from then on): "
        + ", ".join(f"{k} {r['start']:.0f} ms" for k, r in restarts.items())
    )
    for label, ways in (("write", writes), ("restart", restarts)):
        old, new = ways["JSON on the loop"], ways["executor" if label == "write" else "sections"]
        print(
            f"{label}: longest stall {old['longest'] / new['longest']:.0f}x shorter, "
            f"wall time {old['wall'] / new['wall']:.2f}x shorter than the baseline's"
        )
    print("read paths, us/call: " + ", ".join(f"{k} {v:.2f}" for k, v in reads.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--events", type=int, default=20_000, help="replayed after the snapshot")
    parser.add_argument("--child", nargs=2, metavar=("WAY", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    freeze_heap_in_this_process()  # as `tierbroker serve` does: this process is the benchmark's
    if args.child:
        way, directory = args.child
        asyncio.run(
            restart_child(way, Path(directory), args.segments[0], args.events, args.partitions)
        )
        return
    for n in args.segments:
        asyncio.run(run(n, args.partitions, args.events))


if __name__ == "__main__":
    main()
