"""`tierbroker remote restore`: recreate a topic on a cluster from its bucket alone.

What the bucket holds (`remote_bucket`): each partition's segment manifests, and its
`PartitionIndex` (partition count, config overrides, log start offset, leader epoch).
The restore:

1. reads them (`RestorePlan`): the topic id (the newest, or `--topic-id`, when the
   bucket holds several topics of the name), the segments, the first leader epoch above
   every epoch of the history;
2. refuses a cluster where the topic exists, or lacks `__remote_log_metadata`;
3. publishes each segment's COPY_SEGMENT_STARTED and COPY_SEGMENT_FINISHED events to
   `__remote_log_metadata`, in the partitions and the form the brokers' metadata
   manager writes them (acks=all), before the topic exists: a leader of a new partition
   reads its metadata up to the end before it acts;
4. creates the topic with its id, configs and first leader epoch (`create_options`);
   each partition's leader, its log empty, starts its log after the remote tier with the
   history's leader epochs and producer state, as a follower rebuilt from the remote
   tier does, and its followers rebuild from it;
5. waits for every partition's end to reach the end of its remote history, then moves
   the log start offset to the index's (DeleteRecords: records deleted before the loss
   stay deleted, and expiration removes the segments below it).

Produce to the topic only once the restore has finished: an append to a partition
whose leader has not started after its history yet would start the log at offset 0.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

from tierbroker.broker.cli.remote_bucket import PartitionDir, list_partitions, manifests
from tierbroker.broker.metadata.create_options import CREATE_FIRST_LEADER_EPOCH, CREATE_TOPIC_ID
from tierbroker.pipeline.discovery import RemoteSegment, parse_manifest, resolve_overlaps
from tierbroker.pipeline.storage import ObjectInfo, ObjectNotFoundError, ObjectStore
from tierbroker.storage.remote.partition_index import PartitionIndex
from tierbroker.storage.remote.segment_codec import AS_WRITTEN_TAG, CHUNKED_TAG
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from tierbroker.storage.remote.topic_based_rlmm import (
    metadata_partition,
    metadata_record_key,
    segment_event,
)

log = logging.getLogger(__name__)

METADATA_TOPIC = "__remote_log_metadata"


class RestoreError(Exception):
    """The restore cannot go on; the message says why."""


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    partition: int
    segments: list[RemoteLogSegmentMetadata]  # every committed segment, by event time
    readable: list[RemoteSegment]  # the ones of the history's lineage that serve reads
    index: PartitionIndex | None

    @property
    def end_offset(self) -> int:
        """The offset after the remote history: where the log continues."""
        return self.readable[-1].end_offset + 1 if self.readable else 0

    @property
    def first_offset(self) -> int:
        return self.readable[0].start_offset if self.readable else 0

    @property
    def log_start_offset(self) -> int:
        """Where the log started before the loss (DeleteRecords, retention)."""
        recorded = self.index.log_start_offset if self.index else 0
        return min(max(recorded, self.first_offset), self.end_offset)

    @property
    def size_bytes(self) -> int:
        return sum(s.segment_size_bytes for s in self.segments)


@dataclass(frozen=True, slots=True)
class RestorePlan:
    topic: str
    topic_id: str
    partition_count: int
    configs: dict[str, str]
    first_leader_epoch: int
    partitions: list[PartitionPlan]


def plan_restore(store: ObjectStore, topic: str, topic_id: str | None) -> RestorePlan:
    """What the bucket holds of `topic`; RestoreError if nothing, or several topic ids
    without `topic_id` to choose."""
    dirs = list_partitions(store, topic)
    ids = {d.topic_id for d in dirs}
    if topic_id is None and len(ids) > 1:
        raise RestoreError(
            f"{store.url} holds topic {topic!r} under the ids {sorted(ids)}: choose one "
            "with --topic-id"
        )
    chosen = {d: objs for d, objs in dirs.items() if topic_id is None or d.topic_id == topic_id}
    if not chosen:
        raise RestoreError(f"{store.url} holds no partition of topic {topic!r}")
    plans = [_partition_plan(store, where, objs) for where, objs in chosen.items()]
    indexes = [p.index for p in plans if p.index is not None]
    latest = max(indexes, key=lambda i: i.leader_epoch, default=None)
    epochs = [e for p in plans for s in p.segments for e, _ in s.segment_leader_epochs]
    epochs += [i.leader_epoch for i in indexes]
    count = max([p.partition + 1 for p in plans] + [i.topic.partition_count for i in indexes])
    configs = dict(latest.topic.configs) if latest else {}
    configs["remote.storage.enable"] = "true"
    known = {p.partition: p for p in plans}
    return RestorePlan(
        topic=topic,
        topic_id=next(iter(chosen)).topic_id,
        partition_count=count,
        configs=configs,
        first_leader_epoch=max(epochs, default=-1) + 1,
        partitions=[known.get(p) or PartitionPlan(p, [], [], None) for p in range(count)],
    )


def _partition_plan(
    store: ObjectStore, where: PartitionDir, objects: list[ObjectInfo]
) -> PartitionPlan:
    segments: list[RemoteLogSegmentMetadata] = []
    readers: list[RemoteSegment] = []
    for manifest in manifests(objects):
        try:
            document = store.get(manifest.key)
            metadata = RemoteLogSegmentMetadata.from_json(json.loads(document)["segment"])
        except ObjectNotFoundError:
            continue
        except (ValueError, KeyError) as e:
            raise RestoreError(f"{manifest.key}: not a segment manifest ({e})") from None
        reader = parse_manifest(where.cluster, manifest.key, document)
        # What the copy that wrote it recorded (KIP-917): how the segment is stored.
        tag = AS_WRITTEN_TAG if reader.log_format.plain else CHUNKED_TAG
        segments.append(replace(metadata, custom_metadata=tag))
        readers.append(reader)
    index = None
    try:
        index = PartitionIndex.from_json(store.get(where.index_key), where.index_key)
    except ObjectNotFoundError:
        log.warning("%s: no partition index; its log starts at its first segment", where)
    except ValueError as e:
        raise RestoreError(str(e)) from None
    segments.sort(key=lambda m: (m.event_timestamp_ms, m.start_offset))
    ranges = resolve_overlaps(readers)
    readable = list({id(r.segment): r.segment for r in ranges}.values())
    return PartitionPlan(where.partition, segments, readable, index)


def metadata_records(plan: RestorePlan, metadata_partitions: int) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of the events to publish: each segment started, then
    finished, in the order its partition's leaders recorded them."""
    records = []
    for p in plan.partitions:
        for segment in p.segments:
            started = segment.with_state(
                RemoteLogSegmentState.COPY_SEGMENT_STARTED, segment.event_timestamp_ms
            )
            finished = started.with_state(
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, segment.event_timestamp_ms
            )
            tip = segment.topic_id_partition
            for event in (started, finished):
                records.append(
                    (
                        metadata_partition(tip, metadata_partitions),
                        metadata_record_key(tip),
                        json.dumps(segment_event(event)).encode(),
                    )
                )
    return records


def create_configs(plan: RestorePlan) -> dict[str, str]:
    return {
        **plan.configs,
        CREATE_TOPIC_ID: plan.topic_id,
        CREATE_FIRST_LEADER_EPOCH: str(plan.first_leader_epoch),
    }
