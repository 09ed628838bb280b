"""`RemoteTransactionIndex`: the aborted transactions a read_committed fetch of remote
offsets must be told of (Kafka's `RemoteLogManager.addAbortedTransactions`).

The search runs over the transaction indexes of the remote segments from the one
holding the fetch offset on, then over the local log, and stops at the first entry
whose last stable offset reaches the fetch's upper bound: an ABORT marker may lie in a
later segment, local still, than the data it aborts. A segment without aborted
transactions uploaded no index and says so in its metadata (`txn_index_empty`, KIP-1058),
so a read_committed fetch of a topic without aborted transactions costs no request;
one copied before that field existed is looked up (the store answers not found).
Parsed indexes are kept in an LRU of `max_segments` segments; an index never changes.
"""

from __future__ import annotations

from collections import OrderedDict

from tierbroker.protocol.records import iter_batches, whole_batches_size
from tierbroker.storage.log import Log
from tierbroker.storage.remote.metadata_manager import RemoteLogMetadataManager
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata, TopicIdPartition
from tierbroker.storage.remote.storage_manager import (
    IndexType,
    RemoteResourceNotFoundError,
    RemoteStorageManager,
)
from tierbroker.storage.transaction_index import AbortedTxn, collect_aborted, parse_entries


class RemoteTransactionIndex:
    def __init__(
        self,
        rlmm: RemoteLogMetadataManager,
        rsm: RemoteStorageManager,
        max_segments: int = 1024,
    ) -> None:
        self.rlmm = rlmm
        self.rsm = rsm
        self.max_segments = max_segments
        self._indexes: OrderedDict[object, list[AbortedTxn]] = OrderedDict()

    async def aborted_txns(
        self, tip: TopicIdPartition, lg: Log, fetch_offset: int, records: memoryview
    ) -> list[AbortedTxn]:
        """Those overlapping the remote `records` read from `fetch_offset`, each once."""
        whole = records[: whole_batches_size(records)]
        upper = max((b.next_offset for b in iter_batches(whole)), default=fetch_offset)
        found: dict[tuple[int, int], AbortedTxn] = {}
        complete = False
        for metadata in self.rlmm.readable_segments(tip):
            if metadata.end_offset < fetch_offset or metadata.txn_index_empty:
                continue
            result = collect_aborted(await self._entries(metadata), fetch_offset, upper)
            found.update(((t.producer_id, t.first_offset), t) for t in result.aborted)
            if result.complete:
                complete = True
                break
        if not complete:
            for t in lg.collect_aborted_txns(fetch_offset, upper):
                found[(t.producer_id, t.first_offset)] = t
        return sorted(found.values(), key=lambda t: t.first_offset)

    async def _entries(self, metadata: RemoteLogSegmentMetadata) -> list[AbortedTxn]:
        key = metadata.segment_id.id
        entries = self._indexes.get(key)
        if entries is not None:
            self._indexes.move_to_end(key)
            return entries
        try:
            entries = parse_entries(await self.rsm.fetch_index(metadata, IndexType.TRANSACTION))
        except RemoteResourceNotFoundError:
            entries = []
        self._indexes[key] = entries
        while len(self._indexes) > self.max_segments:
            self._indexes.popitem(last=False)
        return entries
