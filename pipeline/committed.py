"""`CommittedView`: what a read_committed reader may take of a partition's remote tier,
from the object store alone.

- The aborted transactions: the transaction indexes uploaded with the segments (those
  whose metadata says `txn_index_empty` have none, and cost no request).
- The stable end. A segment is copied only below the last stable offset, but a
  transaction open when the last copied segment rolled may have been decided since by a
  marker that is local only: its records can be neither shown nor dropped. So the
  remote tier is read committed up to the first offset of the oldest transaction the
  last segment's producer snapshot holds open, and no further; the brokers serve the
  rest.

A segment that should have a transaction index but whose indexes cannot be read makes
the view fail (`ValueError`): its records' fate cannot be proved.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace

from tierbroker.pipeline.discovery import RemoteSegment, SegmentRange
from tierbroker.pipeline.segments import load_indexes
from tierbroker.pipeline.storage import ObjectStore
from tierbroker.storage.producer_state import NO_TXN, parse_snapshot
from tierbroker.storage.remote.storage_manager import IndexType
from tierbroker.storage.transaction_index import AbortedTxn, parse_entries

SegmentCache = MutableMapping[str, "SegmentTxns"]
"""Segment id -> what it says of transactions (a segment's objects never change)."""
AbortedSpans = Mapping[int, tuple[tuple[int, int], ...]]
"""Producer id -> the (first offset, marker offset) of each of its aborted transactions."""


def is_aborted(aborted: AbortedSpans, producer_id: int, offset: int) -> bool:
    """A record of a transactional batch at `offset` belongs to an aborted transaction."""
    return any(first <= offset < marker for first, marker in aborted.get(producer_id, ()))


@dataclass(frozen=True, slots=True)
class SegmentTxns:
    aborted: tuple[AbortedTxn, ...]  # whose markers it holds
    first_open: int  # the first offset of the oldest transaction open at its end, else the end


@dataclass(frozen=True, slots=True)
class CommittedView:
    aborted: AbortedSpans
    stable_end: int  # exclusive

    def is_aborted(self, producer_id: int, offset: int) -> bool:
        return is_aborted(self.aborted, producer_id, offset)

    def trim(self, ranges: list[SegmentRange]) -> list[SegmentRange]:
        """`ranges` cut at the stable end."""
        kept = []
        for r in ranges:
            if r.first_offset >= self.stable_end:
                break
            kept.append(
                r
                if r.last_offset < self.stable_end
                else replace(r, last_offset=self.stable_end - 1)
            )
        return kept


def committed_view(
    store: ObjectStore, ranges: list[SegmentRange], cache: SegmentCache
) -> CommittedView:
    """The view of the partition whose remote tier `ranges` are (blocking: run it off the
    event loop); `cache` keeps what each segment says between calls."""
    segments = list({r.segment.segment_id: r.segment for r in ranges}.values())
    aborted: dict[int, list[tuple[int, int]]] = {}
    for segment in segments:
        if segment.segment_id not in cache:
            cache[segment.segment_id] = _segment_txns(store, segment)
        for t in cache[segment.segment_id].aborted:
            aborted.setdefault(t.producer_id, []).append((t.first_offset, t.last_offset))
    stable_end = ranges[-1].last_offset + 1 if ranges else 0
    if segments:
        stable_end = min(stable_end, cache[segments[-1].segment_id].first_open)
    return CommittedView({p: tuple(v) for p, v in aborted.items()}, stable_end)


def _segment_txns(store: ObjectStore, segment: RemoteSegment) -> SegmentTxns:
    indexes = load_indexes(store, segment)
    if not indexes and not segment.txn_index_empty:
        raise ValueError(
            f"segment {segment.segment_id} of {segment.topic}-{segment.partition}: its indexes "
            "cannot be read, so its aborted transactions are not known"
        )
    aborted = tuple(parse_entries(indexes.get(IndexType.TRANSACTION, b"")))
    end = segment.end_offset + 1
    snapshot = indexes.get(IndexType.PRODUCER_SNAPSHOT)
    if snapshot is None:  # none uploaded: no producer state, so no transaction
        return SegmentTxns(aborted, end)
    firsts = [
        e.current_txn_first_offset
        for e in parse_snapshot(snapshot)
        if e.current_txn_first_offset != NO_TXN
    ]
    return SegmentTxns(aborted, min([end, *firsts]))
