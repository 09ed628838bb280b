"""The remote log metadata consumer: a broker that hosts no replica of a metadata partition
reads it from its leader, and a partition it leads or follows is ready only once its
metadata is read up to what was written before the assignment."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

from tests.unit.test_remote_metadata import FINISHED, STARTED, TIP, MemoryTopic, segment
from tests.unit.test_rlm_components import wait_until
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.remote.topic_based_rlmm import TopicBasedRemoteLogMetadataManager


class RemoteOnlyTopic(MemoryTopic):
    """The metadata topic as seen by a broker hosting none of its replicas: reading the local
    replica fails, fetching from the leader works; a fetch may be held to see it in flight."""

    def __init__(self, shared: MemoryTopic) -> None:
        super().__init__()
        self.records = shared.records
        self.hold: asyncio.Event | None = None

    def read(self, partition: int, start_offset: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        raise KafkaError(ErrorCode.not_leader_or_follower, "no replica here")

    async def fetch(
        self, partition: int, start_offset: int
    ) -> tuple[list[tuple[int, bytes, bytes | None]], int]:
        records = self.records.get(partition, [])
        fetched: list[tuple[int, bytes, bytes | None]] = [
            (o, k, v) for o, (k, v) in enumerate(records) if o >= start_offset
        ]
        answer = fetched, len(records)
        if self.hold is not None:
            await self.hold.wait()
        return answer


async def two_brokers(
    tmp_path: Path,
) -> tuple[TopicBasedRemoteLogMetadataManager, TopicBasedRemoteLogMetadataManager, RemoteOnlyTopic]:
    """A broker hosting the metadata topic that tiered a segment, and one hosting none."""
    shared = MemoryTopic()
    first = TopicBasedRemoteLogMetadataManager(shared, tmp_path / "a")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    await first.start()
    s = segment(0, 9, state=STARTED)
    await first.add_remote_log_segment_metadata(s)
    await first.update_remote_log_segment_metadata(s.with_state(FINISHED, 1))
    remote = RemoteOnlyTopic(shared)
    second = TopicBasedRemoteLogMetadataManager(remote, tmp_path / "b")
    await second.start()
    return first, second, remote


async def test_a_broker_without_a_metadata_replica_learns_the_segments_once_ready(
    tmp_path: Path,
) -> None:
    first, second, _ = await two_brokers(tmp_path)
    assert second.readable_segments(TIP) == []
    assert not second.is_ready(TIP)  # not assigned: nothing is done for it
    second.on_partition_leadership_changes([TIP], [])
    assert not second.is_ready(TIP)
    await second.consumer.consume(second.consumer.assigned[TIP])
    assert second.is_ready(TIP)
    assert [m.end_offset for m in second.readable_segments(TIP)] == [9]
    second.on_stop_partitions([TIP])
    assert not second.is_ready(TIP)
    await first.close()
    await second.close()


async def test_the_consumer_task_reads_assigned_partitions_by_itself(tmp_path: Path) -> None:
    first, second, _ = await two_brokers(tmp_path)
    second.on_partition_leadership_changes([], [TIP])
    await wait_until(lambda: second.is_ready(TIP), "the partition ready")
    assert [m.end_offset for m in second.readable_segments(TIP)] == [9]
    # A later event of another broker arrives without anyone asking.
    later = segment(10, 19, state=STARTED)
    await first.add_remote_log_segment_metadata(later)
    await wait_until(
        lambda: len(list(second.list_remote_log_segments(TIP))) == 2, "the later segment"
    )
    await first.close()
    await second.close()


async def test_a_fetch_begun_before_the_assignment_does_not_make_it_ready(
    tmp_path: Path,
) -> None:
    first, second, remote = await two_brokers(tmp_path)
    await second.consumer.close()  # the test drives the fetches
    partition = second._partition_of(TIP)
    remote.hold = asyncio.Event()
    early = asyncio.create_task(second.consumer.consume(partition))
    await asyncio.sleep(0)  # the fetch is in flight, its answer taken
    s = segment(10, 19, state=STARTED)
    await first.add_remote_log_segment_metadata(s)  # written before the assignment
    second.on_partition_leadership_changes([TIP], [])
    remote.hold.set()
    await early
    assert not second.is_ready(TIP)  # the event at offset 2 is not read yet
    await second.consumer.consume(partition)
    assert second.is_ready(TIP)
    assert len(list(second.list_remote_log_segments(TIP))) == 2
    await first.close()
    await second.close()


async def test_a_publisher_without_a_replica_reads_its_own_events_back(tmp_path: Path) -> None:
    first, second, _ = await two_brokers(tmp_path)
    second.on_partition_leadership_changes([TIP], [])
    s = segment(10, 19, state=STARTED)
    await second.add_remote_log_segment_metadata(s)  # reads what came before it, then itself
    await second.update_remote_log_segment_metadata(s.with_state(FINISHED, 2))
    assert [m.end_offset for m in second.readable_segments(TIP)] == [9, 19]
    partition = second._partition_of(TIP)
    assert second.next_offsets[partition] == len(first.topic.records[partition])  # type: ignore[attr-defined]
    await first.close()
    await second.close()
