"""Options and input-partition planning of the `tierbroker` Spark source (no pyspark here).

Options, named as Spark's Kafka source names them where it has them:

- `storage` (required): `file:///dir` or `s3://bucket/prefix?endpoint=...` (see
  `pipeline.storage`); RSM-named settings (`storage.aws.access.key.id`, ...,
  `key.prefix`) pass through to the store.
- `topic` (or `subscribe`): one topic, or several separated by commas.
- `cluster`, `key.prefix.entropy.bits` (alias `entropyBits`): where the broker's
  `ObjectKeyLayout` put the objects (see `pipeline.discovery`).
- `partitions`: a comma-separated subset of partition numbers.
- `startingOffsets` / `endingOffsets`: `earliest`, `latest`, or JSON per partition,
  `{"topic":{"0":23,"1":-2}}` (-2 earliest, -1 latest); ending offsets are
  exclusive; partitions left out of the JSON read from earliest / to latest.
- `startingTimestamp` / `endingTimestamp` (ms, every partition), or
  `startingOffsetsByTimestamp` / `endingOffsetsByTimestamp` (JSON per partition):
  translated to offsets as ListOffsets does (the first offset whose timestamp is
  >= the given one; none: latest). Timestamps win over offsets, as in Spark.
- `maxBytesPerPartition` (default 128 MiB): larger segments are split at offset
  index entries, so each split starts on a batch boundary.
- `failOnDataLoss` (default true): a segment deleted (by retention) between
  planning and reading fails the query; false skips it with a warning.
- `segments`: comma-separated segment ids to read (the export job's resume).

Planning lists manifests, resolves overlaps, prunes segments outside the offset
range (timestamps first become offsets) and makes one `Split` per segment range
or byte range. A `Split` carries everything an executor needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tierbroker.pipeline.discovery import RemoteSegment, SegmentDiscovery, SegmentRange
from tierbroker.pipeline.segments import load_offset_index, offset_for_timestamp
from tierbroker.pipeline.storage import ObjectStore, open_store

DEFAULT_MAX_BYTES_PER_PARTITION = 128 * 1024 * 1024
EARLIEST, LATEST = -2, -1
_STORE_KEYS = ("storage.", "key.prefix")


@dataclass(frozen=True, slots=True)
class Split:
    """Records [first_offset, last_offset] of one segment, from batches starting in a byte range."""

    storage: str
    store_options: tuple[tuple[str, str], ...]
    segment: RemoteSegment
    first_offset: int
    last_offset: int
    byte_start: int = 0
    byte_end: int | None = None  # exclusive; None: the end of the segment
    seek: bool = False  # find byte_start from the offset index on the executor
    fail_on_data_loss: bool = True

    @property
    def range(self) -> SegmentRange:
        return SegmentRange(self.segment, self.first_offset, self.last_offset)


@dataclass(frozen=True)
class ReadOptions:
    storage: str
    topics: list[str]
    store_options: dict[str, str] = field(default_factory=dict)
    cluster: str | None = None
    entropy_bits: int = 0
    partitions: set[int] | None = None
    starting: str = "earliest"
    ending: str = "latest"
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    starting_by_timestamp: dict[str, dict[str, int]] | None = None
    ending_by_timestamp: dict[str, dict[str, int]] | None = None
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    fail_on_data_loss: bool = True
    segments: set[str] | None = None

    @classmethod
    def parse(cls, raw: dict[str, str]) -> ReadOptions:
        """Check and convert the options of a read (keys case-insensitive)."""
        options = {k.lower(): v for k, v in raw.items()}
        storage = options.get("storage")
        topics = options.get("topic") or options.get("subscribe")
        if not storage or not topics:
            raise ValueError("the tierbroker source needs the `storage` and `topic` options")

        def number(name: str) -> int | None:
            text = options.get(name.lower())
            if text is None or text == "":
                return None
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"option {name}={text!r} is not an integer") from None

        def by_partition(name: str) -> dict[str, dict[str, int]] | None:
            text = options.get(name.lower())
            return None if text is None else _partition_json(name, text)

        partitions = options.get("partitions")
        segments = options.get("segments")
        return cls(
            storage=storage,
            topics=[t.strip() for t in topics.split(",") if t.strip()],
            store_options={k: v for k, v in options.items() if k.startswith(_STORE_KEYS)},
            cluster=options.get("cluster") or None,
            entropy_bits=number("key.prefix.entropy.bits") or number("entropyBits") or 0,
            partitions=None if not partitions else {int(p) for p in partitions.split(",")},
            starting=options.get("startingoffsets", "earliest"),
            ending=options.get("endingoffsets", "latest"),
            starting_timestamp=number("startingTimestamp"),
            ending_timestamp=number("endingTimestamp"),
            starting_by_timestamp=by_partition("startingOffsetsByTimestamp"),
            ending_by_timestamp=by_partition("endingOffsetsByTimestamp"),
            max_bytes_per_partition=number("maxBytesPerPartition")
            or DEFAULT_MAX_BYTES_PER_PARTITION,
            fail_on_data_loss=options.get("failondataloss", "true").lower() != "false",
            segments=None if not segments else {s.strip() for s in segments.split(",")},
        )

    def open(self) -> ObjectStore:
        return open_store(self.storage, self.store_options)


def _partition_json(name: str, text: str) -> dict[str, dict[str, int]]:
    try:
        data: Any = json.loads(text)
        return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in data.items()}
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f'option {name}: expected {{"topic":{{"0":23}}}}, got {text!r}') from None


def _offset(spec: str, topic: str, partition: int, default: int, earliest: int, latest: int) -> int:
    """An offset from `earliest` / `latest` / JSON, clamped to [earliest, latest]."""
    if spec in ("earliest", "latest"):
        value = EARLIEST if spec == "earliest" else LATEST
    else:
        value = _partition_json("offsets", spec).get(topic, {}).get(str(partition), default)
    if value == EARLIEST:
        return earliest
    if value == LATEST:
        return latest
    return min(max(value, earliest), latest)


def _bound(
    store: ObjectStore,
    ranges: list[SegmentRange],
    tp: tuple[str, int],
    timestamp: int | None,
    by_timestamp: dict[str, dict[str, int]] | None,
    offsets: str,
    default: int,
) -> int:
    earliest, latest = ranges[0].first_offset, ranges[-1].last_offset + 1
    topic, partition = tp
    if timestamp is None and by_timestamp is not None:
        timestamp = by_timestamp.get(topic, {}).get(str(partition))
    if timestamp is not None:
        found = offset_for_timestamp(store, ranges, timestamp)
        return latest if found is None else found
    return _offset(offsets, topic, partition, default, earliest, latest)


def plan(options: ReadOptions) -> list[Split]:
    """The splits of a read: one per segment range, or per byte range of a large segment."""
    store = options.open()
    try:
        discovery = SegmentDiscovery(
            store, cluster=options.cluster, entropy_bits=options.entropy_bits
        )
        splits: list[Split] = []
        for topic in options.topics:
            for partition in discovery.partitions(topic):
                if options.partitions is not None and partition not in options.partitions:
                    continue
                ranges = discovery.ranges(topic, partition)
                if not ranges:
                    continue
                tp = (topic, partition)
                start = _bound(
                    store,
                    ranges,
                    tp,
                    options.starting_timestamp,
                    options.starting_by_timestamp,
                    options.starting,
                    EARLIEST,
                )
                end = _bound(
                    store,
                    ranges,
                    tp,
                    options.ending_timestamp,
                    options.ending_by_timestamp,
                    options.ending,
                    LATEST,
                )
                for range_ in ranges:
                    lo, hi = max(range_.first_offset, start), min(range_.last_offset, end - 1)
                    if lo > hi:
                        continue
                    if options.segments is not None:
                        if range_.segment.segment_id not in options.segments:
                            continue
                    splits.extend(_split(store, options, SegmentRange(range_.segment, lo, hi)))
        return splits
    finally:
        store.close()


def _split(store: ObjectStore, options: ReadOptions, range_: SegmentRange) -> list[Split]:
    """One split for the range, or several cut at index entries if the segment is large."""
    segment = range_.segment
    base = Split(
        options.storage,
        tuple(sorted(options.store_options.items())),
        segment,
        range_.first_offset,
        range_.last_offset,
        seek=range_.first_offset > segment.start_offset,
        fail_on_data_loss=options.fail_on_data_loss,
    )
    limit = options.max_bytes_per_partition
    if segment.size <= limit or segment.indexes_key is None:
        return [base]
    index = load_offset_index(store, range_)
    if index is None or not len(index):
        return [base]
    # Cuts at indexed batch starts, about `limit` bytes apart: (position, base offset).
    cuts: list[tuple[int, int]] = [(0, segment.start_offset)]
    for offset, position in index:
        if position - cuts[-1][0] >= limit:
            cuts.append((position, offset))
    splits = []
    for i, (position, first) in enumerate(cuts):
        after = cuts[i + 1] if i + 1 < len(cuts) else None
        if after is not None and after[1] <= range_.first_offset:
            continue  # every batch here ends before the first offset wanted
        if first > range_.last_offset:
            break
        splits.append(
            Split(
                base.storage,
                base.store_options,
                segment,
                range_.first_offset,
                range_.last_offset,
                byte_start=max(position, index.position_for(range_.first_offset)),
                byte_end=None if after is None else after[0],
                fail_on_data_loss=options.fail_on_data_loss,
            )
        )
    return splits
