"""Event-loop stalls of a failover's leader-epoch checkpoints and of retention's deletes.

    .venv/bin/python -m benchmarks.loop_stalls [--partitions 1000] [--mib 1024] [--json OUT]

A probe task sleeps 1 ms at a time on the loop; the longest time it waited beyond
its sleep is the longest stall the loop had while the work ran.

Failover: `--partitions` logs (each led at epoch 0) become leaders at epoch 1, one
after another on the loop, as a broker taking over every partition of a failed one
does (`LeaderEpochCache.assign` at the log end), then the loop waits until every
checkpoint is in its file. Retention: one log of `--mib` MiB in 64 MiB segments
whose `retention.bytes` keeps one segment; `LogManager.cleanup_logs` with
`file.delete.delay.ms=0`, then the loop waits for the files to be gone.

Baseline, in the same run: the same work with each write or unlink done on the loop
(what the broker did before: the checkpoint written, fsynced and renamed inside
`assign`; the segment files unlinked and closed by the retention pass), and the
probe on the idle loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tierbroker.protocol.records import build_batch
from tierbroker.storage.local_log import delete_segment_files
from tierbroker.storage.log import Log
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

SEGMENT_BYTES = 64 << 20
BATCH_VALUE_BYTES = 1 << 19


class StallProbe:
    """Sleeps `tick_s` at a time; records how much later than asked each wake came."""

    def __init__(self, tick_s: float = 0.001) -> None:
        self.tick_s = tick_s
        self.longest_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(self.tick_s)
            self.longest_s = max(self.longest_s, loop.time() - asked - self.tick_s)

    async def measure(self, work: Callable[[], Awaitable[None]]) -> tuple[float, float]:
        """(longest stall in ms, wall time of `work` in ms)."""
        self.longest_s = 0.0
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(self.tick_s * 3)  # the probe is ticking before the work starts
        started = time.perf_counter()
        try:
            await work()
        finally:
            elapsed = time.perf_counter() - started
            await asyncio.sleep(self.tick_s * 3)  # the probe's late wake is recorded
            self._task.cancel()
            await asyncio.wait([self._task])  # the probe's own cancellation, not ours
        return self.longest_s * 1000, elapsed * 1000


def _logs(directory: Path, count: int) -> list[Log]:
    logs = []
    for p in range(count):
        tp = TopicPartition("failover", p)
        lg = Log(directory / str(tp), tp, LogConfig(), uuid.uuid4())
        lg.leader_epoch_cache.assign(0, 0)  # no loop here: written at once
        logs.append(lg)
    return logs


async def failover(directory: Path, partitions: int, *, on_the_loop: bool) -> tuple[float, float]:
    logs = _logs(directory, partitions)

    async def become_leaders() -> None:
        for lg in logs:
            lg.leader_epoch_cache.assign(1, lg.log_end_offset)
            if on_the_loop:
                lg.leader_epoch_cache.flush()
        for lg in logs:
            await lg.leader_epoch_cache.writer.wait_written()

    try:
        return await StallProbe().measure(become_leaders)
    finally:
        for lg in logs:
            lg.close()


async def retention(directory: Path, mib: int, *, on_the_loop: bool) -> tuple[float, float]:
    config = LogConfig(
        segment_bytes=SEGMENT_BYTES, retention_bytes=SEGMENT_BYTES, file_delete_delay_ms=0
    )
    tp = TopicPartition("retention", 0)
    manager = LogManager([directory])
    manager.load_logs(lambda _tp, _id: config)
    await manager.create_logs([tp], uuid.uuid4(), config, leader_epoch=0)
    lg = manager.logs[tp]
    batch = build_batch([(None, b"x" * BATCH_VALUE_BYTES, [], 1_000)], base_offset=0)
    for _ in range(mib * 2):
        lg.append_as_leader(bytearray(batch), 0)
    lg.update_high_watermark(lg.log_end_offset)

    async def retain() -> None:
        if on_the_loop:
            lg.delete_old_segments()
            delete_segment_files(lg.take_deleted(older_than_ms=2**62))
        else:
            manager.cleanup_logs()
            await manager.wait_deletions(600)

    try:
        return await StallProbe().measure(retain)
    finally:
        lg.close()


async def run(partitions: int, mib: int) -> dict[str, Any]:
    idle_ms, _ = await StallProbe().measure(lambda: asyncio.sleep(0.5))
    results: dict[str, Any] = {"idle_stall_ms": idle_ms}
    for name, on_the_loop in (("on_the_loop", True), ("offloaded", False)):
        with tempfile.TemporaryDirectory(prefix="loop-stalls-") as tmp:
            stall, wall = await failover(Path(tmp), partitions, on_the_loop=on_the_loop)
            results[f"failover_{name}"] = {"longest_stall_ms": stall, "wall_ms": wall}
        with tempfile.TemporaryDirectory(prefix="loop-stalls-") as tmp:
            stall, wall = await retention(Path(tmp), mib, on_the_loop=on_the_loop)
            results[f"retention_{name}"] = {"longest_stall_ms": stall, "wall_ms": wall}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.partitions, args.mib))
    print(f"idle loop: longest stall {results['idle_stall_ms']:.1f} ms")
    for work, what in (
        ("failover", f"{args.partitions} partitions become leaders"),
        ("retention", f"retention deletes {args.mib} MiB"),
    ):
        before = results[f"{work}_on_the_loop"]
        after = results[f"{work}_offloaded"]
        print(
            f"{what}: longest stall {after['longest_stall_ms']:.1f} ms "
            f"(writes on the loop: {before['longest_stall_ms']:.1f} ms, "
            f"ratio {after['longest_stall_ms'] / before['longest_stall_ms']:.3f}); "
            f"until durable {after['wall_ms']:.0f} ms (on the loop: {before['wall_ms']:.0f} ms)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
