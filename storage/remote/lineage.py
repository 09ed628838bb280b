"""Leader-epoch lineages: which remote segments hold the records of which log.

A record is named by (leader epoch, offset): only an epoch's leader writes records in it,
and replicas truncate to their leader's epochs, so two logs that hold the same (epoch,
offset) agree on every offset up to it, batch for batch. A log's *lineage* is its
leader-epoch entries `[(epoch, start offset), ...]`, epochs and offsets increasing, the
last epoch running on. After an unclean election, or a copy a deposed leader finished
late, the remote tier can hold segments of two lineages over the same offsets: a segment
agrees with a lineage up to the last offset where both have the same epoch
(`agreed_end`), and is *in* the lineage when it agrees to its end.

The broker reads along its own log's lineage (the epoch of an offset comes from its
leader-epoch cache, as in Kafka). The rule for readers with no log (`latest_lineage`):
**read the lineage of the latest segment (highest epoch), followed backwards from epoch
to parent**, an epoch's parent and start read from a segment holding the end of one and
the start of the other (`lineage_ending_in`, which `remote_log_size(tp, epoch)` follows
from the epoch it is given).

Pure functions over small tuples: safe to share.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata

Lineage = Sequence[tuple[int, int]]  # (epoch, start offset), both increasing

NO_EPOCH = -1


def epoch_for_offset(lineage: Lineage, offset: int) -> int:
    """The epoch of `offset` in `lineage`, or -1 before its first entry."""
    i = bisect.bisect_right(lineage, offset, key=lambda e: e[1]) - 1
    return lineage[i][0] if i >= 0 else NO_EPOCH


def epoch_ranges(epochs: Lineage, end_offset: int) -> list[tuple[int, int, int]]:
    """(epoch, first offset, last offset) of each epoch of a segment ending at `end_offset`."""
    return [
        (epoch, start, epochs[i + 1][1] - 1 if i + 1 < len(epochs) else end_offset)
        for i, (epoch, start) in enumerate(epochs)
    ]


def epoch_end_in(epochs: Lineage, end_offset: int, epoch: int) -> int | None:
    """The last offset of `epoch` in a segment, or None if the segment holds none of it."""
    if epochs[-1][0] == epoch:  # the common case, first: a lookup's hot path
        return end_offset
    for (e, _), (_, next_start) in itertools.pairwise(epochs):
        if e == epoch:
            return next_start - 1
    return None


def agreed_end(epochs: Lineage, end_offset: int, lineage: Lineage) -> int:
    """The last offset of a segment (its `epochs`, its `end_offset`) whose record `lineage`
    also holds; below the segment's first offset if there is none.

    Offsets below the lineage's first entry (the log start moved past them) agree when
    their epoch precedes it: the log no longer says, and Kafka trusts them there too.
    """
    if not lineage:
        return end_offset
    first_epoch, first_start = lineage[0]
    agreed = epochs[0][1] - 1
    for epoch, start, last in epoch_ranges(epochs, end_offset):
        i = bisect.bisect_right(lineage, start, key=lambda e: e[1]) - 1
        if i < 0 and epoch < first_epoch:
            if last >= first_start:
                return first_start - 1
            agreed = last
            continue
        i = max(i, 0)
        if lineage[i][0] != epoch:
            return agreed
        lineage_last = lineage[i + 1][1] - 1 if i + 1 < len(lineage) else math.inf
        if last > lineage_last:
            return int(lineage_last)
        agreed = last
    return agreed


def in_lineage(epochs: Lineage, end_offset: int, lineage: Lineage) -> bool:
    return agreed_end(epochs, end_offset, lineage) >= end_offset


def learn_parents(epochs: Lineage, parents: dict[int, tuple[int, int]]) -> None:
    """Record what a segment tells: each epoch after its first follows the one before it,
    from its start offset (facts of the epoch's leader's log, true in every segment)."""
    for (parent, _), (epoch, start) in itertools.pairwise(epochs):
        parents[epoch] = (parent, start)


def lineage_ending_in(
    epoch: int,
    epochs: Sequence[int],
    parents: Mapping[int, tuple[int, int]],
    span: Callable[[int], tuple[int, int] | None],
) -> list[tuple[int, int]]:
    """The lineage ending in `epoch`, from what the remote tier holds.

    `epochs`: the epochs with remote records, ascending; `parents`: epoch -> (parent,
    start) from `learn_parents`; `span(e)`: the first and last remote offsets of epoch e.
    An epoch with no remote record starts from the highest known epoch below it. An
    epoch whose parent no segment names (its first segment starts where it starts) follows
    the highest earlier epoch holding the offset before its first one, or else the
    highest with records before it.
    """
    i = bisect.bisect_right(epochs, epoch) - 1
    current: int | None = epochs[i] if i >= 0 else None
    found: list[tuple[int, int]] = []
    while current is not None:
        link = parents.get(current)
        if link is not None:
            parent: int | None = link[0]
            start = link[1]
        else:
            current_span = span(current)
            if current_span is None:
                break
            start = current_span[0]
            parent = _holder(epochs, current, start - 1, span)
        found.append((current, start))
        current = parent
    found.reverse()
    return found


def latest_lineage(segments: Iterable[tuple[Lineage, int]]) -> list[tuple[int, int]]:
    """The lineage of the latest of `segments` ((epochs, end offset) each): the one rule
    for a reader with no log of its own, as `lineage_ending_in` the highest epoch."""
    parents: dict[int, tuple[int, int]] = {}
    spans: dict[int, tuple[int, int]] = {}
    for epochs, end_offset in segments:
        learn_parents(epochs, parents)
        for epoch, first, last in epoch_ranges(epochs, end_offset):
            known = spans.get(epoch)
            spans[epoch] = (
                (first, last) if known is None else (min(known[0], first), max(known[1], last))
            )
    if not spans:
        return []
    known_epochs = sorted(spans)
    return lineage_ending_in(known_epochs[-1], known_epochs, parents, spans.get)


def _holder(
    epochs: Sequence[int],
    below: int,
    offset: int,
    span: Callable[[int], tuple[int, int] | None],
) -> int | None:
    """The highest epoch below `below` whose remote records reach over `offset`, or else
    the highest with records before it (the remote tier has a gap there)."""
    fallback = None
    for j in range(bisect.bisect_left(epochs, below) - 1, -1, -1):
        s = span(epochs[j])
        if s is None or s[0] > offset:
            continue
        if offset <= s[1]:
            return epochs[j]  # usually the epoch just below: one step
        if fallback is None:
            fallback = epochs[j]
    return fallback


def lineage_segments(
    segments: Iterable[RemoteLogSegmentMetadata], lineage: Lineage
) -> list[RemoteLogSegmentMetadata]:
    """The segments wholly in `lineage`, in the order given."""
    return [s for s in segments if in_lineage(s.segment_leader_epochs, s.end_offset, lineage)]
