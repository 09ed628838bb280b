"""`LogOffsetMetadata`: an offset with the place in the log where its batch starts.

Kafka's name and fields: the offset, the base offset of the segment holding it and
the byte position of its batch in that segment (the segment's size for the log end
offset). A log keeps one for its high watermark and one for its log end, so a read
up to the high watermark, which every fetch and every wake of a delayed fetch makes,
finds where to stop without reading batch headers. Immutable; safe to share.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class LogOffsetMetadata:
    message_offset: int
    segment_base_offset: int
    relative_position_in_segment: int
