"""A fault of one followed partition stays with it: the fetcher of its leader goes on
fetching the others (a storage error takes only its log dir offline, an answer it cannot
apply backs off that partition, an unexpected error restarts the fetch loop, a rebuild
from the remote tier runs beside the fetch)."""

from __future__ import annotations

import asyncio
import errno
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kio.schema.list_offsets.v11.request import ListOffsetsRequest

from tests.unit.test_rlm_components import wait_until
from tierbroker.broker.metadata.zk_data import PartitionState
from tierbroker.broker.replication.fetch_start import FetchStart
from tierbroker.broker.replication.partition import Partition
from tierbroker.broker.replication.replica_fetcher import FetcherConfig, ReplicaFetcherManager
from tierbroker.protocol.errors import ErrorCode
from tierbroker.protocol.records import build_batch
from tierbroker.storage.log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    Log,
)
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.log_manager import LogManager
from tierbroker.storage.topic_partition import TopicPartition

LEADER, FOLLOWER = 0, 1
END = 5  # the leader's log end offset of every partition
CONFIG = FetcherConfig(backoff_ms=10)
Fault = Callable[[TopicPartition, int], Any]  # (partition, fetch offset) -> answer or None


class FakeLeader:
    """Answers each partition of a Fetch with one record at its fetch offset, up to END;
    `fault` may answer a partition otherwise (or raise for the whole request). ListOffsets
    is answered from `offsets` (by timestamp), each timestamp asked noted in `listed`."""

    def __init__(self, names: dict[tuple[uuid.UUID, int], TopicPartition]) -> None:
        self.names = names
        self.fault: Fault = lambda tp, offset: None
        self.offsets = {
            EARLIEST_TIMESTAMP: 0,
            EARLIEST_LOCAL_TIMESTAMP: 3,
            LATEST_TIMESTAMP: END,
            EARLIEST_PENDING_UPLOAD_TIMESTAMP: 4,
        }
        self.listed: list[int] = []
        self.request_timeout_ms = 30_000

    async def send(self, request: Any) -> Any:
        if isinstance(request, ListOffsetsRequest):
            [topic] = request.topics
            [p] = topic.partitions
            self.listed.append(int(p.timestamp))
            answer = SimpleNamespace(
                error_code=ErrorCode.none, offset=self.offsets[int(p.timestamp)], leader_epoch=0
            )
            return SimpleNamespace(topics=[SimpleNamespace(partitions=[answer])])
        topics, caught_up = [], True
        for topic in request.topics:
            answers = []
            for p in topic.partitions:
                tp, offset = self.names[(topic.topic_id, int(p.partition))], int(p.fetch_offset)
                caught_up &= offset >= END
                answers.append(self.fault(tp, offset) or self.answer(p.partition, offset))
            topics.append(SimpleNamespace(topic_id=topic.topic_id, partitions=answers))
        if caught_up:
            await asyncio.sleep(0.01)  # as the leader's max wait when nothing is new
        return SimpleNamespace(error_code=ErrorCode.none, responses=topics)

    @staticmethod
    def answer(partition: int, offset: int, error: ErrorCode = ErrorCode.none) -> Any:
        records = b""
        if offset < END and error == ErrorCode.none:
            records = build_batch([(b"k", b"v", [], 1)], base_offset=offset)
        return SimpleNamespace(
            partition_index=partition,
            error_code=error,
            diverging_epoch=SimpleNamespace(epoch=-1, end_offset=-1),
            records=records,
            high_watermark=END,
            log_start_offset=0,
        )

    async def close(self) -> None:
        pass


@asynccontextmanager
async def following(
    log_manager: LogManager,
    placement: dict[TopicPartition, Path],
    log_config: LogConfig | None = None,
    config: FetcherConfig = CONFIG,
) -> AsyncIterator[tuple[ReplicaFetcherManager, FakeLeader, dict[TopicPartition, Partition]]]:
    """A follower of every partition of `placement` (in its log dir), all led by one leader."""
    names: dict[tuple[uuid.UUID, int], TopicPartition] = {}
    leader = FakeLeader(names)
    manager = ReplicaFetcherManager(FOLLOWER, lambda: 1, config, lambda moved: None)
    manager.new_client = lambda host, port: leader  # type: ignore[assignment,return-value]
    manager.on_storage_error = lambda partition, error: (
        log_manager.failure_channel.maybe_add_offline_log_dir(
            partition.log.dir.parent, error, "a follower's append"
        )
    )
    partitions = {}
    for tp, log_dir in placement.items():
        lg = Log(log_dir / str(tp), tp, log_config or LogConfig(), uuid.uuid4())
        partition = Partition(lg, FOLLOWER)
        partition.make_follower(PartitionState(LEADER, 0, (LEADER, FOLLOWER), 1, 0), (0, 1))
        names[(partition.topic_id, tp.partition)] = tp
        partitions[tp] = partition
    try:
        for partition in partitions.values():
            manager.add(partition, LEADER, "leader", 9092)
        yield manager, leader, partitions
    finally:
        await manager.close()
        for partition in partitions.values():
            partition.log.close()


def replicated(partitions: list[Partition]) -> Callable[[], bool]:
    return lambda: all(p.log.log_end_offset == END for p in partitions)


async def test_enospc_on_a_followers_append_takes_only_its_log_dir_offline(
    tmp_path: Path,
) -> None:
    full, fine = tmp_path / "full", tmp_path / "fine"
    log_manager = LogManager([full, fine])
    on_full = [TopicPartition("a", 0), TopicPartition("a", 1)]
    on_fine = [TopicPartition("b", 0), TopicPartition("b", 1)]
    placement = {tp: full for tp in on_full} | {tp: fine for tp in on_fine}
    async with following(log_manager, placement) as (manager, _, partitions):
        failing = partitions[on_full[0]].log

        def no_space(records: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        failing.append_as_follower = no_space  # type: ignore[method-assign]
        await wait_until(replicated([partitions[tp] for tp in on_fine]), "the fine dir's logs")
        assert log_manager.failure_channel.is_offline(full)
        assert not log_manager.failure_channel.is_offline(fine)
        assert [tp for tp in placement if manager.endpoint_of(tp) is not None] == on_fine


async def test_running_out_of_file_descriptors_backs_off_and_takes_no_dir_offline(
    tmp_path: Path,
) -> None:
    log_manager = LogManager([tmp_path])
    tp = TopicPartition("a", 0)
    async with following(log_manager, {tp: tmp_path}) as (manager, _, partitions):
        append = partitions[tp].log.append_as_follower
        failures = [OSError(errno.EMFILE, "Too many open files")]

        def out_of_fds(records: Any) -> Any:
            if failures:
                raise failures.pop()
            return append(records)

        partitions[tp].log.append_as_follower = out_of_fds  # type: ignore[method-assign]
        await wait_until(replicated([partitions[tp]]), "the log after the failed append")
        assert not log_manager.failure_channel.offline
        assert manager.endpoint_of(tp) is not None


async def test_an_answer_that_cannot_be_applied_backs_off_that_partition_only(
    tmp_path: Path,
) -> None:
    log_manager = LogManager([tmp_path])
    bad, good = TopicPartition("a", 0), TopicPartition("b", 0)
    async with following(log_manager, {bad: tmp_path, good: tmp_path}) as (_, leader, partitions):
        broken: list[TopicPartition] = []

        def no_high_watermark(tp: TopicPartition, offset: int) -> Any:
            if tp != bad or broken:
                return None
            broken.append(tp)
            answer = FakeLeader.answer(tp.partition, offset)
            answer.high_watermark = None
            return answer

        leader.fault = no_high_watermark
        await wait_until(replicated(list(partitions.values())), "both logs")
        assert broken == [bad]


async def test_an_unexpected_error_of_the_whole_fetch_restarts_the_fetcher(
    tmp_path: Path,
) -> None:
    log_manager = LogManager([tmp_path])
    tps = [TopicPartition("a", 0), TopicPartition("b", 0)]
    async with following(log_manager, {tp: tmp_path for tp in tps}) as (_, leader, partitions):
        raised: list[int] = []

        def undecodable(tp: TopicPartition, offset: int) -> Any:
            if not raised:
                raised.append(offset)
                raise ValueError("not a Fetch response")
            return None

        leader.fault = undecodable
        await wait_until(replicated(list(partitions.values())), "both logs")
        assert raised == [0]


class HangingTierStateMachine:
    """Rebuilds a log to start where asked, once `release` is set (an object store in a
    brownout); the starts asked for in `started`."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[tuple[TopicPartition, FetchStart]] = []

    async def build_remote_log_aux_state(
        self, partition: Partition, leader: object, start: FetchStart
    ) -> Any:
        self.started.append((partition.topic_partition, start))
        await self.release.wait()
        return SimpleNamespace(
            apply=lambda lg: lg.truncate_fully_and_start_at(
                start.offset, start.leader_log_start_offset
            )
        )


async def test_a_rebuild_from_the_remote_tier_never_holds_up_the_other_partitions(
    tmp_path: Path,
) -> None:
    log_manager = LogManager([tmp_path])
    tiered, other = TopicPartition("t", 0), TopicPartition("o", 0)
    tsm = HangingTierStateMachine()
    async with following(log_manager, {tiered: tmp_path, other: tmp_path}) as (
        manager,
        leader,
        partitions,
    ):
        manager.start_tiering(tsm)  # type: ignore[arg-type]

        def moved_to_tiered_storage(tp: TopicPartition, offset: int) -> Any:
            if tp == tiered and offset < 3:
                return FakeLeader.answer(
                    tp.partition, offset, ErrorCode.offset_moved_to_tiered_storage
                )
            return None

        leader.fault = moved_to_tiered_storage
        await wait_until(replicated([partitions[other]]), "the other partition, meanwhile")
        assert [tp for tp, _ in tsm.started] == [tiered]
        assert partitions[tiered].log.log_end_offset == 0
        tsm.release.set()
        await wait_until(replicated([partitions[tiered]]), "the rebuilt partition's tail")
        assert partitions[tiered].log.local_log_start_offset == 3
