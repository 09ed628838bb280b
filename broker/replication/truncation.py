"""Where a follower cuts its log when its leader says their logs diverged (KIP-101, KIP-279).

The leader answers a fetch with a diverging epoch: the largest epoch it has at or below
the follower's last fetched epoch, and where that epoch ends in its log. The follower
keeps what both logs agree on:

- it knows that epoch: truncate to the smaller of the two ends of it (and of its log end);
- it only knows a smaller epoch below it: truncate to the end of that one and ask again
  (the leader's next answer names an older epoch, until both name the same);
- it knows no epoch at or below it: truncate to the leader's end offset.

A pure function of the follower's epoch cache, so a property test can hold it against a
model of two logs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

UNDEFINED = -1


@dataclass(frozen=True, slots=True)
class Truncation:
    offset: int
    complete: bool  # False: the follower asks again from the truncated log


def truncation_for(
    leader_epoch: int,
    leader_end_offset: int,
    follower_end_offset_for: Callable[[int], tuple[int, int]],
    follower_log_end_offset: int,
) -> Truncation:
    """`follower_end_offset_for(epoch)` is the follower's (largest epoch <= epoch, its end)."""
    if leader_end_offset == UNDEFINED:
        return Truncation(follower_log_end_offset, True)
    if leader_epoch == UNDEFINED:
        return Truncation(min(leader_end_offset, follower_log_end_offset), True)
    epoch, end = follower_end_offset_for(leader_epoch)
    if epoch == UNDEFINED or end == UNDEFINED:
        return Truncation(min(leader_end_offset, follower_log_end_offset), True)
    if epoch != leader_epoch:
        return Truncation(min(end, follower_log_end_offset), False)
    return Truncation(min(end, leader_end_offset, follower_log_end_offset), True)
