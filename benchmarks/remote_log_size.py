"""KIP-852: `remote_log_size` from running totals, flat in the number of remote segments.

    python -m benchmarks.remote_log_size

For N = 1k, 10k, 100k finished segments over a few leader epochs, it times
`RemoteLogMetadataCache.remote_log_size` and, in the same run, the naive answer
(summing the sizes of the listed segments), which grows with N.
"""

from __future__ import annotations

import statistics
import time
import uuid

from tierbroker.storage.remote.metadata_cache import RemoteLogMetadataCache
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierbroker.storage.topic_partition import TopicPartition

TIP = TopicIdPartition(uuid.uuid4(), TopicPartition("bench", 0))
SEGMENTS_PER_EPOCH = 10_000


def build(count: int) -> tuple[RemoteLogMetadataCache, float]:
    cache = RemoteLogMetadataCache()
    started = time.perf_counter()
    for i in range(count):
        cache.put(
            RemoteLogSegmentMetadata(
                segment_id=RemoteLogSegmentId.generate(TIP),
                start_offset=i * 1000,
                end_offset=i * 1000 + 999,
                max_timestamp_ms=i,
                broker_id=0,
                event_timestamp_ms=0,
                segment_size_bytes=1 << 20,
                segment_leader_epochs=((i // SEGMENTS_PER_EPOCH, i * 1000),),
                state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            )
        )
    return cache, (time.perf_counter() - started) / count


def median_us(fn: object, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def main() -> None:
    header = ("segments", "remote_log_size us", "listing sum us", "ratio", "add us/segment")
    print("{:>9} {:>19} {:>15} {:>7} {:>15}".format(*header))
    for count in (1_000, 10_000, 100_000):
        cache, add_s = build(count)
        epoch = count // SEGMENTS_PER_EPOCH
        ours = median_us(lambda c=cache, e=epoch: c.remote_log_size(TIP, e), 2000)
        naive = median_us(
            lambda c=cache: sum(s.segment_size_bytes for s in c.readable_segments(TIP)), 20
        )
        assert cache.remote_log_size(TIP, epoch) == count << 20
        print(f"{count:>9} {ours:>19.2f} {naive:>15.1f} {naive / ours:>6.0f}x {add_s * 1e6:>15.1f}")


if __name__ == "__main__":
    main()
