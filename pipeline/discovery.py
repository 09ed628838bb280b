"""Segment discovery from the object store alone: no broker, no metadata topic.

Objects are named by `storage.remote.key_layout.ObjectKeyLayout`::

    <key prefix><entropy>/<cluster>/<topic>-<topic id>/<partition>/<start>-<segment id>.<suffix>

Discovery lists a partition's directory, keeps the segments whose manifest exists
(the RSM writes it last: a segment without it is incomplete, or being deleted,
whose manifest goes first), reads each manifest once (they never change) and
resolves overlaps (`resolve_overlaps`) into an ordered list of offset ranges, each
served by one segment of the partition's lineage, found by the broker's own rule
(`storage.remote.lineage`).

The cluster id is a path component: pass `cluster`, or discovery lists the store
to find the clusters holding the topic. `entropy_bits` must equal the broker's
`rsm.config.key.prefix.entropy.bits`: with N > 0 each partition lives under its
own hash directory, which discovery recomputes and checks.

When a topic name was deleted and created again, the newest topic id (the one
with the latest segment event time) wins unless `topic_id` is given.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tierbroker.pipeline.storage import ObjectNotFoundError, ObjectStore
from tierbroker.storage.checkpoints import kafka_uuid
from tierbroker.storage.remote.key_layout import (
    INDEXES_SUFFIX,
    LOG_SUFFIX,
    MANIFEST_SUFFIX,
    ObjectKeyLayout,
)
from tierbroker.storage.remote.lineage import agreed_end, latest_lineage
from tierbroker.storage.remote.segment_codec import PLAIN, StoredFormat
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata

log = logging.getLogger(__name__)

_TOPIC_ID = re.compile(r"^[A-Za-z0-9_-]{22}$")  # a UUID in unpadded base64url
_MANIFEST_END = "." + MANIFEST_SUFFIX
CLUSTERS_TTL_S = 300.0


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    """One committed remote segment, as its manifest describes it; all a reader needs."""

    cluster: str
    topic: str
    partition: int
    topic_id: str
    segment_id: str
    start_offset: int
    end_offset: int  # inclusive
    max_timestamp_ms: int
    leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset) of its records
    event_timestamp_ms: int
    size: int
    log_key: str
    indexes_key: str | None  # every index in one object (`storage.remote.index_bundle`)
    manifest_key: str
    txn_index_empty: bool = False  # no aborted transaction's marker (KIP-1058)
    log_format: StoredFormat = PLAIN  # how the log and indexes are stored

    @property
    def leader_epoch(self) -> int:
        """The highest leader epoch of its records."""
        return self.leader_epochs[-1][0]


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """Offsets [first_offset, last_offset] of a partition, to be read from `segment`."""

    segment: RemoteSegment
    first_offset: int
    last_offset: int


def parse_manifest(cluster: str, manifest_key: str, document: bytes) -> RemoteSegment:
    """A `RemoteSegment` from a manifest's JSON (see `storage.remote.key_layout`)."""
    data = json.loads(document)
    metadata = RemoteLogSegmentMetadata.from_json(data["segment"])
    objects = data["objects"]
    tip = metadata.topic_id_partition
    base = manifest_key.removesuffix(MANIFEST_SUFFIX)

    def key(suffix: str) -> str | None:
        entry = objects.get(suffix)
        return str(entry["key"]) if entry else None

    log_entry = objects.get(LOG_SUFFIX) or {"key": base + LOG_SUFFIX, "size": 0}
    log_format = StoredFormat.from_json(log_entry)
    stored_size = int(log_entry["size"]) if log_format.plain else 0
    return RemoteSegment(
        cluster=cluster,
        topic=tip.topic_partition.topic,
        partition=tip.topic_partition.partition,
        topic_id=kafka_uuid(tip.topic_id),
        segment_id=str(metadata.segment_id.id),
        start_offset=metadata.start_offset,
        end_offset=metadata.end_offset,
        max_timestamp_ms=metadata.max_timestamp_ms,
        leader_epochs=metadata.segment_leader_epochs,
        event_timestamp_ms=metadata.event_timestamp_ms,
        size=stored_size or metadata.segment_size_bytes,  # of the plain log
        log_key=str(log_entry["key"]),
        indexes_key=key(INDEXES_SUFFIX),
        manifest_key=manifest_key,
        txn_index_empty=metadata.txn_index_empty,
        log_format=log_format,
    )


def resolve_overlaps(segments: Iterable[RemoteSegment]) -> list[SegmentRange]:
    """Non-overlapping ranges in offset order, each offset served by one segment.

    Only the lineage of the latest segment is read, followed backwards as the broker's
    metadata does (`storage.remote.lineage.latest_lineage`); a segment of another lineage
    (an unclean election, a deposed leader's late copy) serves only the offsets where it
    agrees with it. Where segments of the lineage overlap (a new leader uploaded the same
    offsets again) they hold the same records: the one with the higher leader epoch
    serves them, then the later-starting one, then the later upload, then the larger
    segment id: the same answer on every reader.
    """
    segments = list(segments)
    lineage = latest_lineage((s.leader_epochs, s.end_offset) for s in segments)
    agreed = {s.segment_id: agreed_end(s.leader_epochs, s.end_offset, lineage) for s in segments}
    ranked = sorted(
        (s for s in segments if agreed[s.segment_id] >= s.start_offset),
        key=lambda s: (s.leader_epoch, s.start_offset, s.event_timestamp_ms, s.segment_id),
        reverse=True,
    )
    claimed: list[tuple[int, int]] = []  # sorted, disjoint [first, last] already served
    ranges: list[SegmentRange] = []
    for segment in ranked:
        end = agreed[segment.segment_id]
        cursor = segment.start_offset
        for first, last in claimed:
            if last < cursor:
                continue
            if first > end:
                break
            if first > cursor:
                ranges.append(SegmentRange(segment, cursor, first - 1))
            cursor = max(cursor, last + 1)
        if cursor <= end:
            ranges.append(SegmentRange(segment, cursor, end))
        claimed = _merge([*claimed, (segment.start_offset, end)])
    return sorted(ranges, key=lambda r: r.first_offset)


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(intervals):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


class SegmentDiscovery:
    """Finds a topic's partitions and committed segments by listing the store."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        cluster: str | None = None,
        entropy_bits: int = 0,
        topic_id: str | None = None,
    ) -> None:
        ObjectKeyLayout(entropy_bits=entropy_bits)  # validates the range
        self.store = store
        self.cluster = cluster
        self.entropy_bits = entropy_bits
        self.topic_id = topic_id
        self._manifests: dict[str, RemoteSegment] = {}  # manifests never change: read once
        self._clusters: tuple[float, list[str]] | None = None  # (listed at, clusters)
        self._lock = threading.Lock()

    @property
    def prefix(self) -> str:
        return self.store.key_prefix

    def _entropy_dirs(self) -> list[str]:
        """The key prefixes clusters live under: the key prefix, or each hash directory."""
        if self.entropy_bits == 0:
            return [self.prefix]
        width = (self.entropy_bits + 3) // 4
        found = self.store.list_prefixes(self.prefix)
        return [
            d
            for d in found
            if len(name := d[len(self.prefix) : -1]) == width
            and all(c in "0123456789abcdef" for c in name)
        ]

    def clusters(self) -> list[str]:
        """Every cluster id with objects in the store (or the configured one).

        Listed at most every `CLUSTERS_TTL_S` once found: with entropy bits that takes
        one listing per hash directory, too many to repeat on every refresh.
        """
        if self.cluster is not None:
            return [self.cluster]
        with self._lock:
            cached = self._clusters
        if cached is not None and time.monotonic() - cached[0] < CLUSTERS_TTL_S:
            return cached[1]
        roots = self._entropy_dirs()
        found = sorted({d[len(r) : -1] for r in roots for d in self.store.list_prefixes(r)})
        if found:  # an empty store is listed again next time: the first upload may be near
            with self._lock:
                self._clusters = (time.monotonic(), found)
        return found

    def _topic_dirs(self, root: str, cluster: str, topic: str) -> list[str]:
        """`<root><cluster>/<topic>-<id>/` directories of exactly this topic name."""
        start = f"{root}{cluster}/{topic}-"
        return [d for d in self.store.list_prefixes(start) if _TOPIC_ID.match(d[len(start) : -1])]

    def topics(self) -> list[str]:
        """The names of the topics with a directory in the remote tier (`<topic>-<id>/`)."""
        found: set[str] = set()
        for cluster in self.clusters():
            for root in self._entropy_dirs():
                start = f"{root}{cluster}/"
                for d in self.store.list_prefixes(start):
                    entry = d[len(start) : -1]  # the id is 22 characters, "-" among them
                    name, dash, topic_id = entry[:-23], entry[-23:-22], entry[-22:]
                    if name and dash == "-" and _TOPIC_ID.match(topic_id):
                        found.add(name)
        return sorted(found)

    def _expected_root(self, cluster: str, topic: str, partition: int) -> str:
        layout = ObjectKeyLayout(self.prefix, self.entropy_bits, cluster)
        return self.prefix + layout.entropy(topic, partition)

    def partitions(self, topic: str) -> list[int]:
        """The partitions of `topic` that have a directory in the remote tier."""
        found: set[int] = set()
        for cluster in self.clusters():
            for root in self._entropy_dirs():
                for topic_dir in self._topic_dirs(root, cluster, topic):
                    for d in self.store.list_prefixes(topic_dir):
                        name = d[len(topic_dir) : -1]
                        if not name.isdigit():
                            continue
                        partition = int(name)
                        if self._expected_root(cluster, topic, partition) != root:
                            log.warning(
                                "%s: %s is not where %d entropy bits put %s-%d: "
                                "is key.prefix.entropy.bits the broker's?",
                                self.store.url,
                                d,
                                self.entropy_bits,
                                topic,
                                partition,
                            )
                            continue
                        found.add(partition)
        return sorted(found)

    def segments(self, topic: str, partition: int) -> list[RemoteSegment]:
        """The committed segments of a partition (with a manifest), in start offset order."""
        by_cluster: dict[str, list[RemoteSegment]] = {}
        for cluster in self.clusters():
            root = self._expected_root(cluster, topic, partition)
            found: list[RemoteSegment] = []
            for topic_dir in self._topic_dirs(root, cluster, topic):
                found.extend(self._partition_segments(cluster, f"{topic_dir}{partition}/"))
            if found:
                by_cluster[cluster] = found
        if len(by_cluster) > 1:
            raise ValueError(
                f"{self.store.url}: {topic}-{partition} exists in clusters "
                f"{sorted(by_cluster)}: choose one with the `cluster` option"
            )
        segments = next(iter(by_cluster.values()), [])
        by_topic_id: dict[str, list[RemoteSegment]] = defaultdict(list)
        for segment in segments:
            by_topic_id[segment.topic_id].append(segment)
        if self.topic_id is not None:
            chosen = by_topic_id.get(self.topic_id, [])
        elif len(by_topic_id) > 1:
            newest = max(by_topic_id.values(), key=lambda s: max(x.event_timestamp_ms for x in s))
            log.warning(
                "%s: %s-%d has segments of topic ids %s; reading the newest, %s",
                self.store.url,
                topic,
                partition,
                sorted(by_topic_id),
                newest[0].topic_id,
            )
            chosen = newest
        else:
            chosen = segments
        return sorted(chosen, key=lambda s: (s.start_offset, s.segment_id))

    def ranges(self, topic: str, partition: int) -> list[SegmentRange]:
        """The partition's readable offset ranges, overlaps resolved, in offset order."""
        return resolve_overlaps(self.segments(topic, partition))

    def _partition_segments(self, cluster: str, partition_dir: str) -> list[RemoteSegment]:
        manifests = [
            o.key for o in self.store.list_objects(partition_dir) if o.key.endswith(_MANIFEST_END)
        ]
        segments = []
        for key in manifests:
            with self._lock:
                segment = self._manifests.get(key)
            if segment is None:
                try:
                    segment = parse_manifest(cluster, key, self.store.get(key))
                except ObjectNotFoundError:
                    continue  # deleted since the listing: the segment is going
                with self._lock:
                    self._manifests[key] = segment
            segments.append(segment)
        return segments

    def forget(self, segment: RemoteSegment) -> None:
        """Drop a cached manifest (its segment turned out to be gone)."""
        with self._lock:
            self._manifests.pop(segment.manifest_key, None)
