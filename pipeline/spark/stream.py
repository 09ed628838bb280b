"""`spark.readStream.format("tierbroker")`: the source as a micro-batch stream.

Offsets are those of Spark's Kafka source: per topic and partition, the next
offset to read, as JSON (`{"events":{"0":1200,"1":1180}}`), which Spark writes to
the query's checkpoint before each micro-batch and reads back on a restart. A
micro-batch reads [its start, its end) of each partition with the batch source's
planning, so history comes from the object store, and with
`kafka.bootstrap.servers` the live tail comes through the brokers; without it the
stream follows the remote tier as segments are uploaded. A micro-batch planned
again after a restart reads exactly the same offsets, so a sink that commits with
the checkpoint (the file sink) gets every record once.

- `startingOffsets` (default `latest`, as in Spark's streams), `startingTimestamp`,
  `startingOffsetsByTimestamp`: where a new query starts; a restarted query
  resumes from its checkpoint. Partitions that appear later start at their
  earliest offset.
- `maxOffsetsPerTrigger`: at most that many offsets per micro-batch, shared among
  partitions in proportion to what each has left, as Spark's Kafka source does
.
- `failOnDataLoss`: offsets gone (deleted by retention) before a micro-batch read
  them fail the query, or with false are skipped with a warning.
- `Trigger.AvailableNow` reads up to the offsets that were latest when it started.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (  # PySpark >= 4.2
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tierbroker.pipeline.spark.bounds import TopicPartitionKey, TopicView, offset_of
from tierbroker.pipeline.spark.options import ReadOptions
from tierbroker.pipeline.spark.partitions import TaskPartition, read_partition
from tierbroker.pipeline.spark.plan import plan_ranges

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]


def _flat(offsets: Offsets) -> dict[TopicPartitionKey, int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def _nested(offsets: dict[TopicPartitionKey, int]) -> Offsets:
    nested: Offsets = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return nested


def rate_limit(
    limit: int, start: dict[TopicPartitionKey, int], until: dict[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """Spark's `maxOffsetsPerTrigger`: `limit` offsets shared in proportion to each
    partition's backlog; a partition with any backlog gets at least one."""
    sizes = {tp: end - start[tp] for tp, end in until.items() if end - start[tp] > 0}
    total = sum(sizes.values())
    if total < 1:
        return until
    limited = dict(until)
    for tp, size in sizes.items():
        share = limit * size / total
        limited[tp] = min(until[tp], start[tp] + (math.ceil(share) if share < 1 else int(share)))
    return limited


class TierbrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._view: TopicView | None = None  # opened on first use: the reader is pickled
        self._target: dict[TopicPartitionKey, int] | None = None  # Trigger.AvailableNow's end

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_view": None}

    def _fresh_view(self) -> TopicView:
        """The topic view, its cached offsets and ranges forgotten."""
        if self._view is None:
            self._view = TopicView(self.options)
        else:
            self._view.refresh()
        return self._view

    def initialOffset(self) -> Offsets:
        view = self._fresh_view()
        options = self.options
        return _nested(
            {
                tp: offset_of(view, tp, options.starting, "startingOffsets", True, options)
                for tp in view.topic_partitions()
            }
        )

    def _latest(self, view: TopicView) -> dict[TopicPartitionKey, int]:
        latest = {tp: view.latest(tp) for tp in view.topic_partitions()}
        if self._target is not None:
            latest = {
                tp: min(end, self._target[tp]) for tp, end in latest.items() if tp in self._target
            }
        return latest

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        view = self._fresh_view()
        latest = self._latest(view)
        begin = _flat(start)
        for tp in latest:
            begin.setdefault(tp, view.earliest(tp))  # a new partition starts at its earliest
        until = {tp: max(end, begin[tp]) for tp, end in latest.items()}
        if isinstance(limit, ReadMaxRows):
            until = rate_limit(limit.max_rows, begin, until)
        return _nested({**begin, **until})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._latest(self._fresh_view())

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        view = self._view if self._view is not None else self._fresh_view()
        first = _flat(start)
        bounds: dict[TopicPartitionKey, tuple[int, int]] = {}
        for tp, stop in _flat(end).items():
            begin = first.get(tp)
            earliest = view.earliest(tp)
            if begin is None:
                begin = earliest  # appeared during the micro-batch's planning
            elif begin < earliest and begin < stop:
                lost = f"{tp[0]}-{tp[1]}: offsets {begin}..{min(earliest, stop) - 1}"
                if self.options.fail_on_data_loss:
                    raise RuntimeError(
                        f"{lost} are gone (deleted by retention?) before the stream read "
                        "them; set failOnDataLoss=false to skip them"
                    )
                log.warning("%s are gone (deleted by retention?): skipped", lost)
                begin = earliest
            bounds[tp] = (begin, stop)
        return [TaskPartition(t) for t in plan_ranges(view, self.options, bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.schema)

    def commit(self, end: Offsets) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
