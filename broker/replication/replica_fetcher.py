"""Followers fetch from their leaders: one `ReplicaFetcher` per leader broker, over the wire.

As Kafka's `ReplicaFetcherThread` (one fetcher per source broker, `num.replica.fetchers`
= 1): a task loops on Fetch v17 requests for every partition it follows from that
leader, naming this broker in `ReplicaState` with its broker epoch, at each log's end
offset and last fetched epoch. Per partition of the answer:

- records are appended as they came (offsets and epochs kept), then the leader's high
  watermark and log start offset are followed;
- a diverging epoch truncates the log where it left the leader's (`truncation`), and
  the next fetch goes on from there;
- OFFSET_OUT_OF_RANGE: the leader's log end is below ours (an unclean election):
  truncate to it; or ours is below the leader's log start: start over there, unless
  KIP-1023 applies (an empty log of a tiered partition, `fetch_start`): then as below;
- OFFSET_MOVED_TO_TIERED_STORAGE: our log end is below the leader's local log, on a
  tiered partition: rebuild the log from the remote tier (`TierStateMachine`) up to where
  `fetch_start` says it starts (the leader's local log start, or for an empty log with
  KIP-1023 the leader's earliest offset pending upload), in a task of that partition's
  own, which leaves it out of the fetch meanwhile (a slow remote tier never holds up the
  other partitions), then fetch only the leader's records from there;
- leadership errors (NOT_LEADER_OR_FOLLOWER, FENCED / UNKNOWN_LEADER_EPOCH, ...): back off
  `replica.fetch.backoff.ms`; the metadata cache will move the partition to its new leader.

- an OSError appending (ENOSPC, EIO, ...) takes the partition's log dir offline
  (`on_storage_error`) and the partition stops being fetched; EMFILE / ENFILE (out of file
  descriptors, not a fault of the disk) and any other unexpected error back off that
  partition only, logged, as Kafka's AbstractFetcherThread marks a partition failed.

Records for a log dir below `log.dir.min.free.bytes` are not appended: the partition is
fetched again after the backoff, until space is freed, rather than filling the disk
until an ENOSPC takes the dir offline.

A partition removed while its fetch (or its rebuild) is in flight, or whose leader
epoch changed, has the answer dropped. Record bytes fetched are counted per topic
(`bytes_fetched`, Kafka's ReplicationBytesInPerSec). Connection failures and undecodable
responses back off and retry; an unexpected error of the fetch loop itself is logged and
the loop restarts after back-off: the fetcher never ends on its own, and `close()`
cancels it and its rebuilds and closes its connection.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kio.schema.fetch.v17 import request as fetch_request
from kio.schema.types import BrokerId
from kio.static.primitive import i8, i32, i32Timedelta, i64

from tierbroker.broker.network.broker_client import (
    BrokerClient,
    BrokerUnavailable,
    MalformedResponse,
)
from tierbroker.broker.network.inter_broker import InterBrokerChannel
from tierbroker.broker.replication.fetch_start import (
    fetch_start,
    should_fetch_from_last_tiered_offset,
)
from tierbroker.broker.replication.leader_endpoint import LeaderEndpoint
from tierbroker.broker.replication.partition import Partition
from tierbroker.broker.replication.tier_state_machine import TierStateMachine
from tierbroker.broker.replication.truncation import truncation_for
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.protocol.records import InvalidRecordError
from tierbroker.storage.free_space import FreeSpaceGuard
from tierbroker.storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from tierbroker.storage.remote.storage_manager import RemoteStorageError
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

# Partitions of one answer applied between two turns of the event loop.
PARTITIONS_PER_TURN = 200
_WAIT_MAX_WHILE_REBUILDING_MS = 50

FETCH_VERSION = 17
_RETRIABLE = {
    ErrorCode.not_leader_or_follower,
    ErrorCode.unknown_topic_or_partition,
    ErrorCode.unknown_topic_id,
    ErrorCode.unknown_leader_epoch,
    ErrorCode.fenced_leader_epoch,
    ErrorCode.kafka_storage_error,
    ErrorCode.replica_not_available,
    ErrorCode.leader_not_available,
}


# Out of file descriptors: the process's limit, not the disk; retried as Kafka's are not.
@dataclass(frozen=True, slots=True)
class FetcherConfig:
    wait_max_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 1024 * 1024  # per partition
    response_max_bytes: int = 10 * 1024 * 1024
    backoff_ms: int = 1000
    socket_timeout_ms: int = 30_000
    # follower.fetch.last.tiered.offset.enable (KIP-1023); on, unlike Kafka's default.
    last_tiered_offset_enable: bool = True


@dataclass(slots=True)
class _FetchState:
    partition: Partition
    leader_epoch: int
    delayed_until: float = 0.0  # monotonic seconds
    lag: int = 0  # the leader's high watermark less this log's end, at the last answer
    rebuilding: asyncio.Task[None] | None = None  # while set, left out of the fetch


class ReplicaFetcher:
    """Fetches from one leader broker the partitions this broker follows there."""

    def __init__(
        self,
        broker_id: int,
        broker_epoch: Callable[[], int],
        leader_id: int,
        client: BrokerClient,
        config: FetcherConfig,
        on_appended: Callable[[list[Partition]], None],
        bytes_fetched: dict[str, int],
        on_storage_error: Callable[[Partition, OSError], bool],
        free_space: FreeSpaceGuard | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.free_space = free_space
        self.leader_id = leader_id
        self.client = client
        self.leader = LeaderEndpoint(broker_id, leader_id, client)
        self.config = config
        self.on_appended = on_appended  # partitions whose log or high watermark moved
        self.bytes_fetched = bytes_fetched  # record bytes by topic, shared by the fetchers
        self.on_storage_error = on_storage_error  # True: the partition's log dir is offline
        self.tier_state_machine: TierStateMachine | None = None  # set once tiering starts
        self.partitions: dict[TopicPartition, _FetchState] = {}
        self.stopping = False  # this broker is shutting down: its leaders may be too
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing_since: float | None = None

    def add(self, partition: Partition) -> None:
        self.partitions[partition.topic_partition] = _FetchState(partition, partition.leader_epoch)
        self._changed.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"replica-fetcher-{self.broker_id}-from-{self.leader_id}"
            )

    def remove(self, tp: TopicPartition) -> None:
        state = self.partitions.pop(tp, None)
        if state is not None and state.rebuilding is not None:
            state.rebuilding.cancel()

    async def close(self) -> None:
        tasks = [s.rebuilding for s in self.partitions.values() if s.rebuilding is not None]
        if self._task is not None:
            tasks.append(self._task)
            self._task = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                log.error(
                    "replica fetcher %d: task %s had failed",
                    self.broker_id,
                    task.get_name(),
                    exc_info=task.exception(),
                )
        await self.client.close()

    async def _run(self) -> None:
        """Fetch until cancelled: an unexpected error is logged and fetching starts over
        after back-off, so no error ends the fetcher."""
        while True:
            try:
                await self._fetch_loop()
            except Exception:
                log.exception(
                    "replica fetcher %d: fetching from %d failed; restarting in %d ms",
                    self.broker_id,
                    self.leader_id,
                    self.config.backoff_ms,
                )
                await asyncio.sleep(self.config.backoff_ms / 1000)

    async def _fetch_loop(self) -> None:
        while True:
            now = time.monotonic()
            fetchable = [(tp, s) for tp, s in self.partitions.items() if s.rebuilding is None]
            ready = {tp: s for tp, s in fetchable if s.delayed_until <= now}
            if not ready:
                self._changed.clear()
                delays = [s.delayed_until - now for _, s in fetchable]
                try:
                    async with asyncio.timeout(min(delays, default=None)):
                        await self._changed.wait()
                except TimeoutError:
                    pass
                continue
            try:
                response = await self.client.send(self._fetch_request(ready))
            except (BrokerUnavailable, KafkaError) as e:
                self._connection_failed(e)
                await asyncio.sleep(self.config.backoff_ms / 1000)
                continue
            except MalformedResponse as e:
                log.warning("replica fetcher %d: %s; retrying", self.broker_id, e)
                self._delay(ready.values())
                continue
            if self._failing_since is not None:
                log.info(
                    "replica fetcher %d: leader %d reachable again", self.broker_id, self.leader_id
                )
                self._failing_since = None
            await self._process(ready, response)

    def _connection_failed(self, error: Exception) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.log(
                logging.DEBUG if self.stopping else logging.WARNING,
                "replica fetcher %d: cannot fetch from broker %d: %s; retrying every %d ms",
                self.broker_id,
                self.leader_id,
                error,
                self.config.backoff_ms,
            )

    def _fetch_request(self, ready: dict[TopicPartition, _FetchState]) -> Any:
        # Offsets and epochs of our own logs are in range: cast, not kio's checked
        # constructors, which cost half of building the request.
        by_topic: dict[Any, list[Any]] = {}
        max_bytes = cast(i32, self.config.max_bytes)
        for tp, state in ready.items():
            lg = state.partition.log
            by_topic.setdefault(state.partition.topic_id, []).append(
                fetch_request.FetchPartition(
                    partition=cast(i32, tp.partition),
                    current_leader_epoch=cast(i32, state.leader_epoch),
                    fetch_offset=cast(i64, lg.log_end_offset),
                    last_fetched_epoch=cast(i32, lg.leader_epoch_cache.latest_epoch),
                    log_start_offset=cast(i64, lg.log_start_offset),
                    partition_max_bytes=max_bytes,
                )
            )
        return fetch_request.FetchRequest(
            replica_state=fetch_request.ReplicaState(
                replica_id=BrokerId(self.broker_id), replica_epoch=i64(self.broker_epoch())
            ),
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=self._wait_max_ms())),
            min_bytes=i32(self.config.min_bytes),
            max_bytes=i32(self.config.response_max_bytes),
            isolation_level=i8(0),
            topics=tuple(
                fetch_request.FetchTopic(topic_id=topic_id, partitions=tuple(parts))
                for topic_id, parts in by_topic.items()
            ),
            forgotten_topics_data=(),
        )

    async def _process(self, ready: dict[TopicPartition, _FetchState], response: Any) -> None:
        if response.error_code != ErrorCode.none:
            log.info(
                "replica fetcher %d: fetch from %d failed: %s",
                self.broker_id,
                self.leader_id,
                ErrorCode(response.error_code).name,
            )
            self._delay(ready.values())
            return
        by_key = {(s.partition.topic_id, tp.partition): (tp, s) for tp, s in ready.items()}
        moved: list[Partition] = []
        answers = (
            (topic.topic_id, data) for topic in response.responses for data in topic.partitions
        )
        for done, (topic_id, data) in enumerate(answers, 1):
            if done % PARTITIONS_PER_TURN == 0:
                await asyncio.sleep(0)  # other work runs between slices of a large answer
            found = by_key.get((topic_id, int(data.partition_index)))
            if found is None:
                continue
            tp, requested = found
            if not self._is_current(tp, requested):
                continue  # removed, or led anew, while the fetch was in flight
            state = requested
            try:
                if await self._process_partition(state, data):
                    moved.append(state.partition)
            except OSError as e:
                self._storage_failed(state, e)
            except KafkaError as e:
                log.warning("replica fetcher %d: %s: %s", self.broker_id, tp, e)
                self._delay([state])
            except Exception:  # a bug or an answer we cannot apply: this partition only
                log.exception(
                    "replica fetcher %d: %s failed; retrying in %d ms",
                    self.broker_id,
                    tp,
                    self.config.backoff_ms,
                )
                self._delay([state])
        if moved:
            self.on_appended(moved)

    def _storage_failed(self, state: _FetchState, error: OSError) -> None:
        """An OSError writing `state`'s log: the log dir goes offline and its partitions
        stop being fetched, unless the dir stays online (out of file descriptors only):
        then this partition is fetched again after the backoff."""
        if not self.on_storage_error(state.partition, error):
            self._delay([state])

    def _is_current(self, tp: TopicPartition, state: _FetchState) -> bool:
        """`state` is still how `tp` is fetched here, under the same leader epoch."""
        return (
            self.partitions.get(tp) is state and state.partition.leader_epoch == state.leader_epoch
        )

    async def _process_partition(self, state: _FetchState, data: Any) -> bool:
        """Apply one partition's answer; True if its log or high watermark moved."""
        partition = state.partition
        error = ErrorCode(data.error_code)
        if error == ErrorCode.offset_out_of_range:
            return await self._handle_out_of_range(state)
        if error == ErrorCode.offset_moved_to_tiered_storage:
            return self._start_rebuild(state, int(data.high_watermark))
        if error in _RETRIABLE:
            self._delay([state])
            return False
        if error != ErrorCode.none:
            raise KafkaError(error, f"fetch answered {error.name}")
        diverging = data.diverging_epoch
        if diverging.epoch >= 0 or diverging.end_offset >= 0:
            lg = partition.log
            cut = truncation_for(
                int(diverging.epoch),
                int(diverging.end_offset),
                lambda epoch: lg.leader_epoch_cache.end_offset_for(epoch, lg.log_end_offset),
                lg.log_end_offset,
            )
            log.info(
                "%s: truncating to %d (leader %d: epoch %d ends at %d)",
                partition.topic_partition,
                cut.offset,
                self.leader_id,
                diverging.epoch,
                diverging.end_offset,
            )
            lg.truncate_to(cut.offset)
            return True
        before = (partition.log.log_end_offset, partition.high_watermark)
        records = data.records or b""
        if records and self._short_of_space(partition, len(records)):
            self._delay([state])  # the guard logs why, once a minute
            return False
        try:
            partition.append_records_to_follower(
                records, int(data.high_watermark), int(data.log_start_offset)
            )
        except InvalidRecordError as e:
            raise KafkaError(ErrorCode.corrupt_message, str(e)) from e
        if records:
            topic = partition.topic_partition.topic
            self.bytes_fetched[topic] = self.bytes_fetched.get(topic, 0) + len(records)
        state.lag = max(0, int(data.high_watermark) - partition.log.log_end_offset)
        return (partition.log.log_end_offset, partition.high_watermark) != before

    async def _handle_out_of_range(self, state: _FetchState) -> bool:
        """Kafka's fetchOffsetAndTruncate: follow the leader's log end or log start (True
        unless the partition stopped being fetched so meanwhile), or for an empty log that
        KIP-1023 applies to, start rebuilding it from the remote tier (False)."""
        partition = state.partition
        tp = partition.topic_partition
        lg = partition.log
        leader_end, _ = await self.leader.list_offset(partition, LATEST_TIMESTAMP)
        if not self._is_current(tp, state):
            return False
        if self.config.last_tiered_offset_enable and should_fetch_from_last_tiered_offset(
            lg, leader_end
        ):
            return self._start_rebuild(state, leader_end)
        if leader_end < lg.log_end_offset:
            log.warning(
                "%s: leader %d ends at %d, below this log's end %d: truncating",
                partition.topic_partition,
                self.leader_id,
                leader_end,
                lg.log_end_offset,
            )
            lg.truncate_to(leader_end)
            return True
        leader_start, _ = await self.leader.list_offset(partition, EARLIEST_TIMESTAMP)
        if not self._is_current(tp, state):
            return False
        if lg.log_end_offset < leader_start:
            log.warning(
                "%s: leader %d starts at %d, above this log's end %d: starting over there",
                partition.topic_partition,
                self.leader_id,
                leader_start,
                lg.log_end_offset,
            )
            lg.truncate_fully_and_start_at(leader_start)
        return True

    def _start_rebuild(self, state: _FetchState, leader_offset: int) -> bool:
        """Start rebuilding the log from the remote tier, in its own task; False: nothing
        moved yet. `leader_offset`: the leader's high watermark (or log end) as last told,
        the lag until the next fetch."""
        tp = state.partition.topic_partition
        if self.tier_state_machine is None:
            log.warning(
                "%s: the leader's log starts in the remote tier, which is not started here "
                "(yet, or remote.log.storage.system.enable=false); retrying in %d ms",
                tp,
                self.config.backoff_ms,
            )
            self._delay([state])
            return False
        state.rebuilding = asyncio.get_running_loop().create_task(
            self._rebuild(state, self.tier_state_machine, leader_offset),
            name=f"replica-fetcher-{self.broker_id}-rebuild-{tp}",
        )
        return False

    async def _rebuild(self, state: _FetchState, tsm: TierStateMachine, leader_offset: int) -> None:
        """Rebuild `state`'s log to start where `fetch_start` says, then fetch it again.
        Until it can be (the leader's remote offsets or this broker's metadata not caught
        up, the remote tier failing), the partition backs off and its fetch is answered the
        same."""
        partition = state.partition
        tp = partition.topic_partition
        try:
            start = await fetch_start(partition, self.leader, self.config.last_tiered_offset_enable)
            aux_state = await tsm.build_remote_log_aux_state(partition, self.leader, start)
            if self._is_current(tp, state):
                aux_state.apply(partition.log)
                state.lag = max(0, leader_offset - partition.log.log_end_offset)
                self.on_appended([partition])
        except OSError as e:
            self._storage_failed(state, e)
        except (RemoteStorageError, KafkaError) as e:
            log.warning(
                "%s: cannot rebuild the log from the remote tier yet (retrying in %d ms): %s",
                tp,
                self.config.backoff_ms,
                e,
            )
            self._delay([state])
        except Exception:
            log.exception("%s: rebuild from the remote tier failed", tp)
            self._delay([state])
        finally:
            state.rebuilding = None
            self._changed.set()

    def _wait_max_ms(self) -> int:
        """How long the leader may hold the fetch. While a partition rebuilds, briefly: it
        joins the next fetch, which the leader answers only after this one (in order), and
        the leader's local log start, where the rebuild ends, moves on meanwhile."""
        if any(s.rebuilding is not None for s in self.partitions.values()):
            return min(self.config.wait_max_ms, _WAIT_MAX_WHILE_REBUILDING_MS)
        return self.config.wait_max_ms

    def _short_of_space(self, partition: Partition, size_bytes: int) -> bool:
        guard = self.free_space
        return guard is not None and guard.refusal(partition.log.dir.parent, size_bytes) is not None

    def _delay(self, states: Any) -> None:
        until = time.monotonic() + self.config.backoff_ms / 1000
        for state in states:
            state.delayed_until = until


class ReplicaFetcherManager:
    """The fetchers of one broker, one per leader endpoint."""

    def __init__(
        self,
        broker_id: int,
        broker_epoch: Callable[[], int],
        config: FetcherConfig,
        on_appended: Callable[[list[Partition]], None],
        free_space: FreeSpaceGuard | None = None,
        channel: InterBrokerChannel | None = None,
    ) -> None:
        channel = channel or InterBrokerChannel()
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.config = config
        self.on_appended = on_appended
        self.free_space = free_space
        self.fetchers: dict[tuple[int, str, int], ReplicaFetcher] = {}
        self._following: dict[TopicPartition, tuple[int, str, int]] = {}
        self.bytes_fetched: dict[str, int] = {}  # record bytes appended, by topic
        self.tier_state_machine: TierStateMachine | None = None
        self.stopping = False  # `begin_shutdown` was called
        # After an OSError appending to a follower: True if its log dir is offline now.
        self.on_storage_error: Callable[[Partition, OSError], bool] = _log_storage_error
        self.new_client: Callable[[str, int], BrokerClient] = lambda host, port: BrokerClient(
            host, port, f"broker-{broker_id}-fetcher", config.socket_timeout_ms, channel.security
        )

    def add(self, partition: Partition, leader_id: int, host: str, port: int) -> None:
        """Fetch `partition` from its leader at `host:port` (moving it from any other)."""
        self.remove(partition.topic_partition)
        key = (leader_id, host, port)
        fetcher = self.fetchers.get(key)
        if fetcher is None:
            fetcher = ReplicaFetcher(
                self.broker_id,
                self.broker_epoch,
                leader_id,
                self.new_client(host, port),
                self.config,
                self.on_appended,
                self.bytes_fetched,
                self._storage_failed,
                self.free_space,
            )
            fetcher.tier_state_machine = self.tier_state_machine
            fetcher.stopping = self.stopping
            self.fetchers[key] = fetcher
        fetcher.add(partition)
        self._following[partition.topic_partition] = key

    def begin_shutdown(self) -> None:
        """From now on a leader out of reach is expected (a cluster stops as a whole), not
        worth a warning."""
        self.stopping = True
        for fetcher in self.fetchers.values():
            fetcher.stopping = True

    def start_tiering(self, tier_state_machine: TierStateMachine) -> None:
        """Followers behind their leader's local log rebuild from the remote tier from now."""
        self.tier_state_machine = tier_state_machine
        for fetcher in self.fetchers.values():
            fetcher.tier_state_machine = tier_state_machine

    def remove(self, tp: TopicPartition) -> None:
        key = self._following.pop(tp, None)
        if key is not None:
            self.fetchers[key].remove(tp)

    def _storage_failed(self, partition: Partition, error: OSError) -> bool:
        """True if `partition`'s log dir is offline now: none of its partitions is fetched
        again."""
        offline = self.on_storage_error(partition, error)
        if offline:
            self.remove_log_dir(partition.log.dir.parent)
        return offline

    def remove_log_dir(self, log_dir: Path) -> None:
        """Stop fetching the partitions of `log_dir`, which went offline."""
        for fetcher in self.fetchers.values():
            for tp, state in list(fetcher.partitions.items()):
                if state.partition.log.dir.parent == log_dir:
                    self.remove(tp)

    def lags(self) -> dict[TopicPartition, int]:
        """Per followed partition: how far behind its leader's high watermark it was told."""
        return {
            tp: state.lag
            for fetcher in self.fetchers.values()
            for tp, state in fetcher.partitions.items()
        }

    def endpoint_of(self, tp: TopicPartition) -> tuple[int, str, int] | None:
        """(leader id, host, port) `tp` is fetched from, if it is."""
        return self._following.get(tp)

    async def close(self) -> None:
        fetchers, self.fetchers = self.fetchers, {}
        self._following.clear()
        await asyncio.gather(*(f.close() for f in fetchers.values()), return_exceptions=True)


def _log_storage_error(partition: Partition, error: OSError) -> bool:
    log.error("%s: appending as a follower failed: %s", partition.topic_partition, error)
    return True
