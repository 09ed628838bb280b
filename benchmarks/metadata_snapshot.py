"""Event-loop stalls while the remote-metadata snapshot is written, at 100k remote segments.

    python -m benchmarks.metadata_snapshot [--segments 100000] [--rounds 3]

Builds the metadata of N finished remote segments (over 10 partitions) in a
`TopicBasedRemoteLogMetadataManager`, then writes its snapshot while a probe on the
event loop sleeps 1 ms at a time and records how late each wake-up is. Two ways, in
the same run:

- on the loop (the baseline: how snapshots were written before, the whole document
  built, serialised, written and fsynced inside one call on the loop);
- `snapshot()`: the state copied on the loop, serialised and written in the default
  executor.

The probe alone (an idle second) gives the machine's noise floor in the same run.
Prints, per way, the longest stall of all rounds, the median of the rounds' longest,
the 99th-percentile stall and the snapshot's wall time (medians of the rounds), the
ratio of the longest stalls, and the process RSS before and after the metadata was
built.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from tierbroker.storage.checkpoints import write_atomically
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierbroker.storage.remote.topic_based_rlmm import (
    SNAPSHOT_VERSION,
    TopicBasedRemoteLogMetadataManager,
)
from tierbroker.storage.topic_partition import TopicPartition

PARTITIONS = 10
PROBE_INTERVAL_S = 0.001


class NoTopic:
    """The metadata topic, empty: the benchmark fills the cache directly."""

    num_partitions = 1

    def ensure_created(self) -> None:
        pass

    async def append(self, partition: int, key: bytes, value: bytes) -> int:
        raise NotImplementedError

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        return iter(())


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def build(rlmm: TopicBasedRemoteLogMetadataManager, count: int) -> None:
    tips = [TopicIdPartition(uuid.uuid4(), TopicPartition("bench", p)) for p in range(PARTITIONS)]
    for i in range(count):
        tip = tips[i % PARTITIONS]
        start = (i // PARTITIONS) * 1000
        rlmm.cache.put(
            RemoteLogSegmentMetadata(
                segment_id=RemoteLogSegmentId.generate(tip),
                start_offset=start,
                end_offset=start + 999,
                max_timestamp_ms=1_700_000_000_000 + i,
                broker_id=0,
                event_timestamp_ms=1_700_000_000_000 + i,
                segment_size_bytes=1 << 20,
                segment_leader_epochs=((0, start),),
                state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            )
        )
    rlmm.next_offsets = {0: 2 * count}


def snapshot_on_the_loop(rlmm: TopicBasedRemoteLogMetadataManager) -> None:
    """The baseline: everything inside one call on the event loop."""
    cache = rlmm.cache
    document = {
        "version": SNAPSHOT_VERSION,
        "next_offsets": {str(p): o for p, o in rlmm.next_offsets.items()},
        "segments": [m.to_json() for tip in cache.partitions() for m in cache.all_segments(tip)],
        "superseded": [],
        "partition_deletes": [],
    }
    write_atomically(rlmm.snapshot_path, json.dumps(document))


async def probed(write: Callable[[], Awaitable[None]]) -> tuple[float, float, float]:
    """(longest stall, p99 stall, wall time) in ms while `write` runs."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    done = False

    async def probe() -> None:
        while not done:
            expected = loop.time() + PROBE_INTERVAL_S
            await asyncio.sleep(PROBE_INTERVAL_S)
            lags.append(max(loop.time() - expected, 0.0))

    task = loop.create_task(probe())
    await asyncio.sleep(0.05)
    lags.clear()
    started = time.perf_counter()
    await write()
    wall = time.perf_counter() - started
    await asyncio.sleep(0.05)
    done = True
    await task
    lags.sort()
    return lags[-1] * 1000, lags[int(len(lags) * 0.99)] * 1000, wall * 1000


async def run(segments: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rlmm = TopicBasedRemoteLogMetadataManager(NoTopic(), Path(tmp))
        await rlmm.start()
        before = rss_mib()
        build(rlmm, segments)
        after = rss_mib()

        async def on_loop() -> None:
            snapshot_on_the_loop(rlmm)

        async def idle() -> None:
            await asyncio.sleep(1.0)

        results: dict[str, list[tuple[float, float, float]]] = {
            "idle": [],
            "on the loop": [],
            "executor": [],
        }
        for _ in range(rounds):
            results["idle"].append(await probed(idle))
            results["on the loop"].append(await probed(on_loop))
            results["executor"].append(await probed(rlmm.snapshot))
        size_mib = rlmm.snapshot_path.stat().st_size / (1 << 20)
        restarted = TopicBasedRemoteLogMetadataManager(NoTopic(), Path(tmp))
        await restarted.start()
        restored = sum(len(restarted.readable_segments(t)) for t in restarted.cache.partitions())
        assert restored == segments, f"the snapshot restored {restored} of {segments} segments"

    print(f"{segments} remote segments over {PARTITIONS} partitions; snapshot {size_mib:.1f} MiB")
    print(f"RSS {before:.0f} MiB before the metadata, {after:.0f} MiB with it")
    header = ("snapshot", "longest stall ms", "median longest ms", "p99 stall ms", "wall ms")
    print("{:>12} {:>17} {:>18} {:>13} {:>8}".format(*header))
    longest = {}
    for name, samples in results.items():
        longest[name] = max(s[0] for s in samples)
        typical = statistics.median(s[0] for s in samples)
        p99 = statistics.median(s[1] for s in samples)
        wall = statistics.median(s[2] for s in samples)
        print(f"{name:>12} {longest[name]:>17.1f} {typical:>18.1f} {p99:>13.1f} {wall:>8.0f}")
    ratio = longest["on the loop"] / longest["executor"]
    print(f"longest stall, on the loop / executor: {ratio:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.segments, args.rounds))


if __name__ == "__main__":
    main()
