"""`TopicBasedRemoteLogMetadataManager`: remote-tier metadata kept in `__remote_log_metadata`.

Every change is an event appended to the partition `hash(topic id partition) %
N` of the metadata topic, then applied to the in-memory `RemoteLogMetadataCache`.
Event values are JSON::

    {"type": "segment", "metadata": {...RemoteLogSegmentMetadata.to_json()...}}
    {"type": "partition_delete", "topic_id": ..., "topic": ..., "partition": ..., "state": ...}

A snapshot file (`remote-log-metadata.snapshot` in the first log dir, laid out in
`metadata_snapshot`: the cache's segments and delete states, and the next offset to
read in each metadata partition) is written atomically at most every
`snapshot.interval.ms` and at close, so a restart replays only the events after it,
never the whole topic from offset 0. The state is copied on the event loop, a few
partitions per turn (references to immutable segment metadata; a partition about to
change is copied first, so the copy is the state of one instant; a partition never
loaded is its section of the file read at start, copied as it is); encoding, writing
and fsyncing run in the default executor, one snapshot at a time, in small pieces so
the thread never holds the GIL long. `close()` waits for a write in flight, then
writes the last one.

`start()` runs after the broker has registered and while it replicates (the
metadata topic is one of its partitions), and the broker serves only once it
returns: it checks the snapshot in the executor and reads only where each
partition's segments lie (`UnloadedPartitions`), then replays the events after it a
batch at a time, the loop getting its turn between batches; an event of a partition
not loaded waits for it. A partition is loaded by the first question about it (its
readiness too, up to a few thousand segments), or, led or followed here, by the loader
task, a chunk per turn; it is not ready until then. A damaged snapshot is ignored
with a warning, and the whole topic is replayed.

The events of partitions this broker leads or follows are read from the metadata
partitions' leaders by a `ConsumerTask` (this broker may host no replica of them), and
their tiering work waits until `is_ready`. Events reaching a local replica are applied
too (`follow`): both read from the same next offset, on the loop, so none twice.

As in Kafka, a segment is added in COPY_SEGMENT_STARTED and only a known segment
is updated, along the KIP-405 state machine; an event that breaks this is refused
before it is appended, and skipped with a warning on replay, so a deleted segment
never comes back. Not shared between tasks: the event loop serialises calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tierbroker.protocol.errors import KafkaError
from tierbroker.storage.long_lived import freeze_long_lived
from tierbroker.storage.remote.lineage import Lineage
from tierbroker.storage.remote.metadata_cache import RemoteLogMetadataCache
from tierbroker.storage.remote.metadata_consumer import ConsumerTask, Records
from tierbroker.storage.remote.metadata_manager import MetadataTopic, RemoteLogMetadataManager
from tierbroker.storage.remote.metadata_snapshot import (
    PartitionSnapshot,
    SnapshotFile,
    SnapshotState,
    write_snapshot,
)
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierbroker.storage.remote.unloaded_partitions import PendingEvent, UnloadedPartitions
from tierbroker.storage.topic_partition import TopicPartition

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "remote-log-metadata.snapshot"
STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_SEGMENTS_PER_CHUNK = 1000  # loaded on the loop per turn (a few ms)
_SEGMENTS_LOADED_WHEN_ASKED = 5000  # at most, by `is_ready` (tens of ms)
_EVENTS_PER_BATCH = 100  # replayed on the loop per turn at start (a few ms)
_SEGMENTS_PER_CAPTURE = 10_000  # segments copied per turn for a snapshot (a few ms)


class TopicBasedRemoteLogMetadataManager(RemoteLogMetadataManager):
    def __init__(self, topic: MetadataTopic, snapshot_dir: Path) -> None:
        self.topic = topic
        self.snapshot_path = snapshot_dir / SNAPSHOT_FILE
        self.cache = RemoteLogMetadataCache()
        self.next_offsets: dict[int, int] = {}
        self._applied_ahead: dict[int, set[int]] = {}  # own events applied before replayed
        self._behind: set[int] = set()  # partitions with events to apply
        self.snapshot_interval_ms = 30_000
        self.replayed_events = 0  # events read from the topic at start (after the snapshot)
        self._dirty = False
        self._last_snapshot_ms = 0.0
        self._writing: asyncio.Task[None] | None = None  # the periodic snapshot in flight
        self._write_lock = asyncio.Lock()  # one snapshot write at a time, in capture order
        self.consumer = ConsumerTask(
            topic, self._partition_of, lambda p: self.next_offsets.get(p, 0), self._apply_fetched
        )
        self._unloaded = UnloadedPartitions()  # the snapshot's partitions not loaded yet
        self._to_load: deque[TopicIdPartition] = deque()  # assigned here, for the loader
        self._load_wanted = asyncio.Event()
        self._loader: asyncio.Task[None] | None = None

    def configure(self, configs: Mapping[str, str]) -> None:
        self.snapshot_interval_ms = int(
            configs.get("snapshot.interval.ms", self.snapshot_interval_ms)
        )

    # Loading -------------------------------------------------------------------------

    async def start(self) -> None:
        # Created now, as Kafka's RLMM does when it initialises: creating its partitions
        # on the first copy stalled the broker while it served produce.
        await self.topic.ensure_created()
        await self._load_snapshot()
        for partition in range(self.topic.num_partitions):
            # Nothing else reads the topic before `follow`: the reader may wait across turns.
            for applied, _ in enumerate(self._applying(partition), 1):
                self.replayed_events += 1
                if applied % _EVENTS_PER_BATCH == 0:
                    await asyncio.sleep(0)
        # What arrived during the last turns, then every later event: nothing in between.
        for partition in range(self.topic.num_partitions):
            self.replayed_events += self.catch_up(partition)
        self.topic.follow(self._catch_up_soon)
        self.consumer.start()
        self._loader = asyncio.get_running_loop().create_task(
            self._load_assigned(), name="rlmm-loader"
        )
        self._dirty = self.replayed_events > 0
        freeze_long_lived()  # the sections' headers and the events waiting live on
        log.info(
            "remote log metadata: %d partitions known, %d events replayed after the snapshot; "
            "%d remote segments of %d partitions loaded when first needed",
            len(self.partitions()),
            self.replayed_events,
            self._unloaded.segment_count(),
            len(list(self._unloaded)),
        )

    def catch_up(self, partition: int) -> int:
        """Apply the events of a metadata partition not applied yet (written by this broker
        or, replicated here, by others); the number applied."""
        return sum(1 for _ in self._applying(partition))

    def _applying(self, partition: int) -> Iterator[None]:
        """Apply the partition's events not applied yet, yielding after each. A partition
        this broker holds no replica of is skipped."""
        try:
            for offset, _key, value in self.topic.read(
                partition, self.next_offsets.get(partition, 0)
            ):
                self._apply_record(partition, offset, value)
                yield
        except KafkaError as e:
            log.debug("remote log metadata partition %d not read here: %s", partition, e)

    def _apply_fetched(self, partition: int, records: Records) -> None:
        """Apply fetched records from the partition's next offset on (a local catch-up may
        have applied some while the fetch was in flight)."""
        for offset, _key, value in records:
            if offset >= self.next_offsets.get(partition, 0):
                self._apply_record(partition, offset, value)

    def _apply_record(self, partition: int, offset: int, value: bytes | None) -> None:
        """Apply the event at the partition's next offset, unless `_publish` applied it ahead."""
        ahead = self._applied_ahead.get(partition, set())
        if offset in ahead:
            ahead.discard(offset)
        elif value is not None:
            self._replay(partition, offset, value)
        self.next_offsets[partition] = offset + 1
        self._dirty = True

    def on_partition_leadership_changes(
        self, leaders: Iterable[TopicIdPartition], followers: Iterable[TopicIdPartition]
    ) -> None:
        tips = [*leaders, *followers]
        self.consumer.assign(tips)
        self._to_load.extend(tip for tip in tips if tip in self._unloaded)
        if self._to_load:
            self._load_wanted.set()

    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:
        self.consumer.unassign(list(partitions))

    def is_ready(self, tip: TopicIdPartition) -> bool:
        # A partition this small is loaded now: less than a failed attempt and its retry.
        if tip in self._unloaded and self._unloaded.left(tip) <= _SEGMENTS_LOADED_WHEN_ASKED:
            self._loaded(tip)
        return tip not in self._unloaded and self.consumer.is_ready(tip)

    def _catch_up_soon(self, partition: int) -> None:
        """Other brokers' events reached this broker's replica: apply them after the
        current callback, once per partition however often it is called meanwhile."""
        if partition not in self._behind:
            self._behind.add(partition)
            asyncio.get_running_loop().call_soon(self._catch_up_behind)

    def _catch_up_behind(self) -> None:
        behind, self._behind = self._behind, set()
        for partition in sorted(behind):
            self.catch_up(partition)

    async def _load_snapshot(self) -> None:
        """Open the snapshot, if there is a good one: its partitions' segments stay in it
        until needed (`UnloadedPartitions`)."""
        opening = asyncio.get_running_loop().run_in_executor(
            None, SnapshotFile.open, self.snapshot_path
        )
        try:
            file = await asyncio.shield(opening)
        except asyncio.CancelledError:  # a cancelled start leaves no descriptor open
            opening.add_done_callback(_close_opened)
            raise
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warning("ignoring damaged %s: %s", self.snapshot_path, e)
            return
        self.next_offsets = dict(file.next_offsets)
        self._unloaded = UnloadedPartitions(file)

    def _loaded(self, tip: TopicIdPartition) -> None:
        """Load the partition now if it is still in the snapshot file: every question about
        a partition asks this first, so none is answered from a partial view."""
        if tip in self._unloaded:
            self._apply_waiting(self._unloaded.load(tip, self.cache))

    async def _load_in_turns(self, tip: TopicIdPartition) -> None:
        """Load the partition a chunk per turn of the loop (a question meanwhile loads the
        rest); the loop's turn comes after each chunk, the last too, so many small
        partitions do not hold it either."""
        while tip in self._unloaded:
            self._apply_waiting(self._unloaded.load(tip, self.cache, _SEGMENTS_PER_CHUNK))
            await asyncio.sleep(0)

    def _apply_waiting(self, waiting: list[PendingEvent] | None) -> None:
        """A partition was loaded: apply the events that waited for it, in order."""
        if waiting is None:
            return
        for partition, offset, value in waiting:
            self._replay(partition, offset, value)
        if not self._write_lock.locked():  # else the snapshot in flight may copy from it
            self._unloaded.close_if_done()

    async def _load_assigned(self) -> None:
        """The loader: the partitions led or followed here, in the order assigned, so their
        tiering work (which waits for `is_ready`) starts without a question loading them."""
        while True:
            await self._load_wanted.wait()
            self._load_wanted.clear()
            started, assigned, loaded = time.monotonic(), 0, 0
            while self._to_load:
                tip = self._to_load.popleft()
                assigned += 1
                if tip not in self._unloaded:
                    continue  # a question loaded it first
                try:
                    await self._load_in_turns(tip)
                    loaded += 1
                except (OSError, ValueError) as e:  # not ready; a question tries again
                    log.error("%s: unreadable in %s: %s", tip, self.snapshot_path, e)
                except Exception:
                    log.exception("%s: loading its remote log metadata failed", tip)
            log.info(
                "remote log metadata of %d partitions led or followed here loaded in %.1f s "
                "(%d by the loader, the others as they were asked about)",
                assigned,
                time.monotonic() - started,
                loaded,
            )

    def _replay(self, partition: int, offset: int, value: bytes) -> None:
        try:
            event = json.loads(value)
            if not self._waits(partition, offset, event, value):
                self._apply(event)
        except (ValueError, KeyError) as e:
            log.warning("skipping remote log metadata at %d:%d: %s", partition, offset, e)

    def _waits(self, partition: int, offset: int, event: dict[str, Any], value: bytes) -> bool:
        """Keep the event for later if its partition is not loaded: as bytes, which the
        cyclic collector never walks, parsed again when it is applied."""
        if not self._unloaded:
            return False
        tip = _event_tip(event)
        if tip not in self._unloaded:
            return False
        self._unloaded.wait(tip, (partition, offset, value))
        return True

    def _check(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Kafka's rules: add in COPY_SEGMENT_STARTED, update only a known segment."""
        self._loaded(metadata.topic_id_partition)
        known = self.cache.contains(metadata)
        if metadata.state == STARTED and known:
            raise ValueError(f"segment {metadata.segment_id.id} is already known")
        if metadata.state != STARTED and not known:
            raise ValueError(f"segment {metadata.segment_id.id} is unknown")
        self.cache.check(metadata)

    def _apply(self, event: dict[str, Any]) -> None:
        if event["type"] == "segment":
            metadata = RemoteLogSegmentMetadata.from_json(event["metadata"])
            self._check(metadata)
            self.cache.put(metadata)
        elif event["type"] == "partition_delete":
            tip = TopicIdPartition(
                uuid.UUID(event["topic_id"]), TopicPartition(event["topic"], event["partition"])
            )
            self.cache.put_partition_delete(tip, RemotePartitionDeleteState[event["state"]])

    # Writes --------------------------------------------------------------------------

    def _partition_of(self, tip: TopicIdPartition) -> int:
        return metadata_partition(tip, self.topic.num_partitions)

    async def _publish(self, tip: TopicIdPartition, event: dict[str, Any]) -> None:
        """Append the event, then read the partition up to it (from the local replica, else
        once from its leader): events other brokers wrote before it are applied first. If
        neither reached it yet, it is applied now and skipped when it is read."""
        partition = self._partition_of(tip)
        value = json.dumps(event).encode()
        offset = await self.topic.append(partition, metadata_record_key(tip), value)
        self.catch_up(partition)
        if self.next_offsets.get(partition, 0) <= offset:
            try:
                await self.consumer.consume(partition)
            except (KafkaError, TimeoutError) as e:
                log.debug("%s: own event at %d:%d not read back yet: %s", tip, partition, offset, e)
        if self.next_offsets.get(partition, 0) <= offset:
            if not self._waits(partition, offset, event, value):
                self._apply(event)
            self._applied_ahead.setdefault(partition, set()).add(offset)
        self._dirty = True

    async def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        if metadata.state != STARTED:
            raise ValueError(f"a segment is added in {STARTED.name}, not {metadata.state.name}")
        await self._publish_segment(metadata)

    async def update_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        if metadata.state == STARTED:
            raise ValueError(f"{STARTED.name} is not an update")
        await self._publish_segment(metadata)

    async def _publish_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        # A refused event never reaches the topic, so replay cannot trip over it.
        self._check(metadata)
        await self._publish(metadata.topic_id_partition, segment_event(metadata))

    async def put_remote_partition_delete_metadata(
        self, tip: TopicIdPartition, state: RemotePartitionDeleteState
    ) -> None:
        await self._publish(tip, {"type": "partition_delete", **_delete_json(tip, state)})

    # Reads ---------------------------------------------------------------------------

    def remote_log_segment_metadata(
        self, tip: TopicIdPartition, leader_epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        self._loaded(tip)
        return self.cache.segment_for_offset(tip, leader_epoch, offset)

    def highest_offset_for_epoch(self, tip: TopicIdPartition, leader_epoch: int) -> int | None:
        self._loaded(tip)
        return self.cache.highest_offset_for_epoch(tip, leader_epoch)

    def list_remote_log_segments(self, tip: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        self._loaded(tip)
        return self.cache.all_segments(tip)

    def readable_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        self._loaded(tip)
        return self.cache.readable_segments(tip)

    def superseded_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        self._loaded(tip)
        return self.cache.superseded_segments(tip)

    def remote_log_size(
        self, tip: TopicIdPartition, leader_epoch: int, lineage: Lineage | None = None
    ) -> int:
        self._loaded(tip)
        return self.cache.remote_log_size(tip, leader_epoch, lineage)

    def partitions(self) -> list[TopicIdPartition]:
        return [*self._loaded_partitions(), *self._unloaded]

    def _loaded_partitions(self) -> list[TopicIdPartition]:
        # A partition the loader is part way through is in the cache and still unloaded.
        return [tip for tip in self.cache.partitions() if tip not in self._unloaded]

    def remote_partition_delete_state(
        self, tip: TopicIdPartition
    ) -> RemotePartitionDeleteState | None:
        self._loaded(tip)
        return self.cache.delete_state(tip)

    # Snapshots -----------------------------------------------------------------------

    def maybe_snapshot(self) -> None:
        """Start writing the snapshot if something changed, the interval has passed and no
        write is in flight; the write runs in its own task, owned here and awaited by close."""
        if self._writing is not None and not self._writing.done():
            return
        now = time.monotonic() * 1000
        if self._dirty and now - self._last_snapshot_ms >= self.snapshot_interval_ms:
            self._writing = asyncio.get_running_loop().create_task(
                self.snapshot(), name="rlmm-snapshot"
            )
            self._writing.add_done_callback(_log_failure)

    async def snapshot(self) -> None:
        """Copy the state, then encode and write it in the default executor."""
        async with self._write_lock:
            self._dirty = False  # a change from now on is not in this snapshot
            try:
                state = await self._capture()
                write = asyncio.get_running_loop().run_in_executor(
                    None, write_snapshot, self.snapshot_path, state
                )
                try:
                    # A cancelled caller still waits for the thread: no second write overlaps.
                    await asyncio.shield(write)
                except asyncio.CancelledError:
                    await asyncio.wait([write])
                    raise
            except BaseException:
                self._dirty = True  # the next snapshot writes it again
                raise
            finally:
                self._unloaded.close_if_done()  # the partitions loaded while it copied
            self._last_snapshot_ms = time.monotonic() * 1000

    async def _capture(self) -> SnapshotState:
        """The state as it is now, copied a few partitions per turn of the loop (copying a
        million references takes longer than a turn should): a partition about to change
        before its turn is copied first, as it is now. Partitions created meanwhile are
        left to the replay after the snapshot's offsets. A partition not loaded is its
        section of the snapshot read at start, once the events waiting for it are applied
        (the snapshot's offsets pass them)."""
        while waiting := self._unloaded.with_pending():
            for tip in waiting:
                await self._load_in_turns(tip)
        next_offsets = dict(self.next_offsets)
        sections = self._unloaded.copies()
        partitions = self._loaded_partitions()
        pending = set(partitions)
        copies: dict[TopicIdPartition, PartitionSnapshot] = {}

        def copy(tip: TopicIdPartition) -> None:
            if tip in pending and tip not in copies:
                copies[tip] = self._partition_snapshot(tip)

        self.cache.before_change = copy
        try:
            copied = 0
            for tip in partitions:
                if tip not in copies:
                    copy(tip)
                    copied += len(copies[tip].segments)
                if copied >= _SEGMENTS_PER_CAPTURE:
                    copied = 0
                    await asyncio.sleep(0)
        finally:
            self.cache.before_change = None
        return SnapshotState(next_offsets, [*(copies[tip] for tip in partitions), *sections])

    def _partition_snapshot(self, tip: TopicIdPartition) -> PartitionSnapshot:
        readable, segments = self.cache.segment_lists(tip)
        superseded = {m.segment_id.id for m in self.cache.superseded_segments(tip)}
        return PartitionSnapshot(tip, self.cache.delete_state(tip), readable, segments, superseded)

    async def close(self) -> None:
        await self._stop_reading()
        if self._writing is not None:
            await asyncio.wait([self._writing])  # its failure was logged; dirty says what's left
        if self._dirty:
            await self.snapshot()
        self._unloaded.close()

    async def abandon(self) -> None:
        """No snapshot: the next start replays the events since the last periodic one."""
        await self._stop_reading()
        if self._writing is not None:  # written whole (renamed into place) or not at all
            await asyncio.wait([self._writing])
        self._unloaded.close()

    async def _stop_reading(self) -> None:
        await self.consumer.close()
        if self._loader is not None:
            self._loader.cancel()
            await asyncio.wait([self._loader])
            self._loader = None
        await self.topic.close()


def metadata_partition(tip: TopicIdPartition, num_partitions: int) -> int:
    """The partition of `__remote_log_metadata` that holds `tip`'s events."""
    key = f"{tip.topic_id}:{tip.topic_partition.partition}".encode()
    return zlib.crc32(key) % num_partitions


def metadata_record_key(tip: TopicIdPartition) -> bytes:
    return str(tip).encode()


def segment_event(metadata: RemoteLogSegmentMetadata) -> dict[str, Any]:
    """The event recording a segment's state (the record's value is its JSON)."""
    return {"type": "segment", "metadata": metadata.to_json()}


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("remote log metadata snapshot failed; it is retried: %s", error)


def _close_opened(opening: asyncio.Future[SnapshotFile]) -> None:
    if opening.exception() is None:
        opening.result().close()


def _event_tip(event: dict[str, Any]) -> TopicIdPartition:
    fields = event["metadata"] if event["type"] == "segment" else event
    return TopicIdPartition(
        uuid.UUID(fields["topic_id"]), TopicPartition(fields["topic"], fields["partition"])
    )


def _delete_json(tip: TopicIdPartition, state: RemotePartitionDeleteState) -> dict[str, Any]:
    tp = tip.topic_partition
    return {
        "topic_id": str(tip.topic_id),
        "topic": tp.topic,
        "partition": tp.partition,
        "state": state.name,
    }
