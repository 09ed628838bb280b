"""`TieredConsumer`: an aiokafka-style consumer that reads the remote tier from the object store.

It wraps an `AIOKafkaConsumer`, which keeps doing group membership, assignment,
commits and offset look-ups; only the bytes of records may come from elsewhere
(the broker-decoupled consumer of the Pinterest design). Per assigned partition and
`getmany` call, the mode routes the current position:

- KAFKA_ONLY: the broker, always (the wrapped consumer, untouched).
- KAFKA_PREFERRED: the broker; when it answers OffsetOutOfRange (or there is no
  position) and the offset lies below its log start but in the object store, the
  object store until the broker's log start.
- REMOTE_PREFERRED: the object store for offsets it holds, the broker for the rest
  (the head of the log that is not tiered yet).
- REMOTE_ONLY: the object store only; reading stops at the end of the remote tier
  and resumes when new segments appear. Record bytes never come from the broker.

A bounded read (`bounded=True`, for backfills) stops instead of polling: each
partition ends at the end of the remote tier as it was when the partition was
first read (or at `end_offsets[tp]`, exclusive). Records at or past the end are
never returned, whatever the tier; once every assigned partition reached its end,
`getmany` returns `{}` at once, `async for` ends and `getone` raises EOFError.

Partitions read from the object store are paused in the wrapped consumer (so it
fetches nothing for them) and its position is moved past every record returned,
so `position()`, `commit()` and auto-commit behave as with the broker path. Offset
resets and the choice of tier per position are `pipeline.routing.TierRouter`'s.

With `isolation_level="read_committed"` both tiers read committed: the wrapped consumer
as aiokafka does, the object store up to what it proves decided (`CommittedView`: the
rest, if any, comes from the broker, or waits in REMOTE_ONLY), without the records of
aborted transactions.

`stats` counts records and bytes per partition and source, so a caller can show
where the data came from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import ConsumerStoppedError, NoOffsetForPartitionError, OffsetOutOfRangeError
from aiokafka.structs import ConsumerRecord, TopicPartition

from tierbroker.pipeline.discovery import SegmentDiscovery
from tierbroker.pipeline.modes import ConsumptionMode, TieredConsumerStats, TieredRebalanceListener
from tierbroker.pipeline.remote_fetcher import RemoteFetch, RemoteFetcher
from tierbroker.pipeline.routing import TierRouter
from tierbroker.pipeline.storage import open_store
from tierbroker.storage.remote.chunk_cache import ChunkCache, ChunkCacheConfig, chunk_store

log = logging.getLogger(__name__)
CHUNK_FETCH_TIMEOUT_S = 60.0  # one ranged GET of a chunk, retries included

Records = dict[TopicPartition, list[ConsumerRecord[Any, Any]]]


class TieredConsumer:
    """AIOKafkaConsumer's interface, reading records from the broker or the object store.

    `storage` is a URL (`file:///dir`, `s3://bucket/prefix?endpoint=...`), required
    unless the mode is KAFKA_ONLY; `storage_options` carries the RSM-named settings
    (credentials, path style); `cluster` and `entropy_bits` locate the partitions as
    the broker's `ObjectKeyLayout` does. `bounded` and `end_offsets` make a bounded
    read (see the module docstring); `end_offsets` alone implies `bounded`. Other
    keyword arguments go to aiokafka.
    Like aiokafka's, it must be created inside a running event loop.
    """

    def __init__(
        self,
        *topics: str,
        mode: ConsumptionMode | str = ConsumptionMode.KAFKA_PREFERRED,
        storage: str | None = None,
        storage_options: Mapping[str, str] | None = None,
        cluster: str | None = None,
        entropy_bits: int = 0,
        remote_refresh_interval_ms: int = 2000,
        remote_read_threads: int = 4,
        bounded: bool = False,
        end_offsets: Mapping[TopicPartition, int] | None = None,
        **kafka_options: Any,
    ) -> None:
        self.mode = ConsumptionMode.of(mode)
        self.bounded = bounded or end_offsets is not None
        if self.bounded and self.mode is ConsumptionMode.KAFKA_ONLY:
            raise ValueError("a bounded read ends at the remote tier's end: not in KAFKA_ONLY")
        self._ends: dict[TopicPartition, int] = dict(end_offsets or {})  # exclusive
        reset = str(kafka_options.get("auto_offset_reset", "latest"))
        if reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset={reset!r}: earliest, latest or none")
        self._fetcher: RemoteFetcher | None = None
        self._router: TierRouter | None = None
        self._executor: ThreadPoolExecutor | None = None
        if self.mode is not ConsumptionMode.KAFKA_ONLY:
            if storage is None:
                raise ValueError(f"{self.mode.name} reads the object store: pass storage=URL")
            kafka_options["auto_offset_reset"] = "none"  # resets are the router's, over both tiers
            store = open_store(storage, storage_options)
            self._executor = ThreadPoolExecutor(remote_read_threads, "tiered-consumer")
            chunk_config = ChunkCacheConfig.from_configs(storage_options or {})
            self._fetcher = RemoteFetcher(
                SegmentDiscovery(store, cluster=cluster, entropy_bits=entropy_bits),
                self._executor,
                ChunkCache(
                    chunk_config,
                    chunk_store(chunk_config),
                    fetch_slots=remote_read_threads,
                    fetch_timeout_s=CHUNK_FETCH_TIMEOUT_S,
                ),
                refresh_interval_s=remote_refresh_interval_ms / 1000,
                chunk_bytes=int(kafka_options.get("max_partition_fetch_bytes", 1 << 20)),
                key_deserializer=kafka_options.get("key_deserializer"),
                value_deserializer=kafka_options.get("value_deserializer"),
                read_committed=kafka_options.get("isolation_level") == "read_committed",
            )
        self._kafka = AIOKafkaConsumer(**kafka_options)
        if self._fetcher is not None:
            group_id = kafka_options.get("group_id")
            self._router = TierRouter(
                self._kafka, self._fetcher, self.mode, reset, group_id, self.seek
            )
        self._max_poll_records: int | None = kafka_options.get("max_poll_records")
        self._user_paused: set[TopicPartition] = set()
        self._poll_s = min(0.2, remote_refresh_interval_ms / 1000)
        self._closed = False
        self.stats = TieredConsumerStats()
        if topics:
            self.subscribe(list(topics))

    @property
    def kafka(self) -> AIOKafkaConsumer:
        """The wrapped aiokafka consumer."""
        return self._kafka

    def __getattr__(self, name: str) -> Any:
        """Everything not redefined here is aiokafka's (topics, highwater, offsets_for_times...)."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._kafka, name)

    # Life cycle and assignment ------------------------------------------------------

    async def start(self) -> None:
        """Connect to the cluster (and join the group, if subscribed)."""
        if self._fetcher is not None:
            await self._fetcher.chunks.start()
        await self._kafka.start()

    async def stop(self) -> None:
        """Leave the group, close connections and the object store's client."""
        self._closed = True
        try:
            await self._kafka.stop()
        finally:
            if self._fetcher is not None:
                await self._fetcher.chunks.close()
                self._fetcher.store.close()
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> TieredConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def subscribe(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Group subscription, as aiokafka's; our listener runs before `listener`."""
        ours = TieredRebalanceListener(self._on_assigned, self._forget, listener)
        self._kafka.subscribe(list(topics), pattern=pattern, listener=ours)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manual assignment, as aiokafka's."""
        new = set(partitions)
        self._forget(self._kafka.assignment() - new)
        self._kafka.assign(list(new))
        self._on_assigned(new)

    def unsubscribe(self) -> None:
        """Drop the subscription or assignment, as aiokafka's."""
        self._forget(self._kafka.assignment())
        self._kafka.unsubscribe()

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        if self.mode in (ConsumptionMode.REMOTE_ONLY, ConsumptionMode.REMOTE_PREFERRED):
            self._kafka.pause(*assigned)  # before the wrapped consumer's first fetch

    def _forget(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._user_paused.discard(tp)
            if self._router is not None and self._fetcher is not None:
                self._router.forget(tp)
                self._fetcher.forget(tp)

    # Positions ------------------------------------------------------------------------

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next offset to return for `partition`, whichever tier holds it."""
        self._kafka.seek(partition, offset)
        if self._router is not None and self._fetcher is not None:
            self._router.positioned.add(partition)
            self._fetcher.forget(partition)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """The earliest offset (over both tiers; REMOTE_ONLY: the remote tier's first)."""
        if self._router is None:
            return await self._kafka.seek_to_beginning(*partitions)  # type: ignore[no-any-return]
        for tp in partitions or self._kafka.assignment():
            await self._router.reset(tp, "earliest")

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """The broker's end (REMOTE_ONLY: the end of the remote tier)."""
        if self._router is None:
            return await self._kafka.seek_to_end(*partitions)  # type: ignore[no-any-return]
        for tp in partitions or self._kafka.assignment():
            await self._router.reset(tp, "latest")

    async def seek_to_committed(self, *partitions: TopicPartition) -> dict[TopicPartition, int]:
        """The group's committed offsets, as aiokafka's."""
        committed: dict[TopicPartition, int] = await self._kafka.seek_to_committed(*partitions)
        if self._router is not None and self._fetcher is not None:
            for tp in partitions or self._kafka.assignment():
                self._router.positioned.add(tp)
                self._fetcher.forget(tp)
        return committed

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record to return (resolving a reset if needed)."""
        if self._router is not None:
            await self._router.ensure_position(partition)
        return int(await self._kafka.position(partition))

    async def commit(self, offsets: Mapping[TopicPartition, Any] | None = None) -> None:
        """Commit the positions (or `offsets`) to the group, as aiokafka's."""
        await self._kafka.commit(offsets)

    def pause(self, *partitions: TopicPartition) -> None:
        """Return nothing for these partitions until resumed, from either tier."""
        self._user_paused.update(partitions)
        self._kafka.pause(*partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        """Resume; partitions read from the object store stay paused in the wrapped consumer."""
        self._user_paused.difference_update(partitions)
        if self._router is None:
            self._kafka.resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        """The partitions paused by `pause`."""
        return set(self._user_paused) if self._router is not None else self._kafka.paused()

    # Bounded reads ----------------------------------------------------------------------

    async def end_offset(self, partition: TopicPartition) -> int:
        """Where a bounded read of `partition` ends (exclusive), fixed at its first call."""
        assert self._fetcher is not None
        end = self._ends.get(partition)
        if end is None:
            await self._fetcher.ranges(partition, refresh=True)
            bounds = await self._fetcher.bounds(partition)
            end = self._ends[partition] = 0 if bounds is None else bounds[1]
            log.info("%s: the bounded read ends at offset %d", partition, end)
        return end

    async def at_end(self, *partitions: TopicPartition) -> bool:
        """Whether a bounded read is done: every (given or assigned) partition is at its end."""
        wanted = set(partitions) or self._kafka.assignment()
        return self.bounded and bool(wanted) and not await self._unfinished(wanted)

    async def _unfinished(self, wanted: set[TopicPartition]) -> set[TopicPartition]:
        """The partitions below their end; those at it are paused in the wrapped consumer."""
        left: set[TopicPartition] = set()
        for tp in wanted:
            if await self.position(tp) < await self.end_offset(tp):
                left.add(tp)
            elif tp not in self._kafka.paused():
                self._kafka.pause(tp)  # fetch nothing more for it
        return left

    def _until(self, tp: TopicPartition) -> int | None:
        """Where object-store reads of `tp` stop: the router's limit or the bounded end."""
        assert self._router is not None
        limits = [self._router.until(tp), self._ends.get(tp) if self.bounded else None]
        return min((x for x in limits if x is not None), default=None)

    def _below_end(
        self, tp: TopicPartition, records: list[ConsumerRecord[Any, Any]]
    ) -> list[ConsumerRecord[Any, Any]]:
        """Broker records of a bounded read below the end; the position moves back to it."""
        end = self._ends.get(tp)
        if not self.bounded or end is None or not records or records[-1].offset < end:
            return records
        self._kafka.seek(tp, end)
        return [r for r in records if r.offset < end]

    # Reading ----------------------------------------------------------------------------

    async def _plan(
        self, wanted: set[TopicPartition]
    ) -> tuple[dict[TopicPartition, int], list[TopicPartition]]:
        """Positions of the partitions to read remotely, and those to read from the broker."""
        assert self._router is not None
        remote: dict[TopicPartition, int] = {}
        broker: list[TopicPartition] = []
        paused = self._kafka.paused()
        for tp in sorted(wanted):
            await self._router.ensure_position(tp)
            offset = int(await self._kafka.position(tp))
            if await self._router.is_remote(tp, offset):
                if tp not in paused:
                    self._kafka.pause(tp)
                if tp not in self._user_paused:
                    remote[tp] = offset
            else:
                if tp in paused and tp not in self._user_paused:
                    self._kafka.resume(tp)
                if tp not in self._user_paused:
                    broker.append(tp)
        return remote, broker

    async def _fetch_remote(
        self, positions: dict[TopicPartition, int], max_records: int | None
    ) -> Records:
        assert self._fetcher is not None and self._router is not None
        fetcher, until = self._fetcher, self._until
        skip = self.mode in (ConsumptionMode.REMOTE_ONLY, ConsumptionMode.REMOTE_PREFERRED)
        results: list[tuple[TopicPartition, RemoteFetch]] = []
        if max_records is None:
            fetched = await asyncio.gather(
                *(fetcher.fetch(tp, o, None, skip, until(tp)) for tp, o in positions.items())
            )
            results = list(zip(positions, fetched, strict=True))
        else:
            budget = max_records
            for tp, offset in positions.items():
                if budget <= 0:
                    break
                result = await fetcher.fetch(tp, offset, budget, skip, until(tp))
                budget -= len(result.records)
                results.append((tp, result))
        out: Records = {}
        for tp, result in results:
            if result.position != positions[tp]:
                self._kafka.seek(tp, result.position)
            self.stats.remote_bytes[tp] += result.bytes_read
            if result.records:
                out[tp] = result.records
                self.stats.remote_records[tp] += len(result.records)
        return out

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> Records:
        """Records by partition, as `AIOKafkaConsumer.getmany`, from either source."""
        if self._router is None:
            got: Records = await self._kafka.getmany(
                *partitions, timeout_ms=timeout_ms, max_records=max_records
            )
            for tp, records in got.items():
                self.stats.broker_records[tp] += len(records)
            return got
        max_records = max_records or self._max_poll_records
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            if self._closed:
                raise ConsumerStoppedError()
            assigned = self._kafka.assignment()
            wanted = set(partitions) & assigned if partitions else set(assigned)
            if self.bounded and wanted:
                wanted = await self._unfinished(wanted)
                if not wanted:
                    return {}  # every partition asked for is at its end
            remote, broker = await self._plan(wanted)
            out = await self._fetch_remote(remote, max_records) if remote else {}
            budget = None if max_records is None else max_records - sum(map(len, out.values()))
            if broker and (budget is None or budget > 0):
                wait = 0.0 if out else max(0.0, deadline - loop.time())
                if remote:
                    wait = min(wait, self._poll_s)  # come back for new remote segments
                try:
                    got = await self._kafka.getmany(
                        *broker, timeout_ms=int(wait * 1000), max_records=budget
                    )
                except OffsetOutOfRangeError as e:
                    for tp, offset in dict(e.args[0]).items():
                        await self._router.out_of_range(tp, offset)
                    got = {}
                except NoOffsetForPartitionError as e:
                    await self._router.reset(e.args[0], self._router.reset_policy)
                    got = {}
                for tp, records in got.items():
                    records = self._below_end(tp, records)
                    if records:
                        out[tp] = records
                        self.stats.broker_records[tp] += len(records)
            elif not broker:
                # Nothing to fetch from the broker, but poll it: that checks group errors
                # and keeps the member alive (max.poll.interval.ms). Paused partitions
                # return nothing, so no record bytes are fetched.
                stray = await self._kafka.getmany(*wanted, timeout_ms=0)
                for tp, records in stray.items():
                    records = self._below_end(tp, records)
                    out.setdefault(tp, []).extend(records)
                    self.stats.broker_records[tp] += len(records)
            if out or loop.time() >= deadline:
                return out
            if not broker:
                await asyncio.sleep(min(self._poll_s, max(0.0, deadline - loop.time())))

    async def _next_record(self, *partitions: TopicPartition) -> ConsumerRecord[Any, Any] | None:
        """The next record, waiting for one; None once a bounded read is at its end."""
        while True:
            got = await self.getmany(*partitions, timeout_ms=1000, max_records=1)
            for records in got.values():
                return records[0]
            if self.bounded and await self.at_end(*partitions):
                return None

    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord[Any, Any]:
        """The next record of any (or the given) assigned partitions, waiting for one.

        Raises EOFError when a bounded read has reached the end of these partitions.
        """
        record = await self._next_record(*partitions)
        if record is None:
            raise EOFError("the bounded read is at its end offsets")
        return record

    def __aiter__(self) -> TieredConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord[Any, Any]:
        """The next record; the iteration ends when the consumer stops or a bounded read ends."""
        try:
            record = await self._next_record()
        except ConsumerStoppedError:
            raise StopAsyncIteration from None
        if record is None:
            raise StopAsyncIteration
        return record
