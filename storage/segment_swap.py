"""The crash-safe swap of a cleaned segment for the segments it replaces (Kafka's
`LocalLog.replaceSegments`), and its completion by the next start.

A new segment's files move through three names:

1. The cleaner writes and fsyncs `<base>.log.cleaned` and its indexes.
2. `commit`: the indexes, then the log, are renamed `.swap`. The log's rename is the
   commit point: from there on a start completes the swap.
3. The replaced segments are renamed `.deleted` (by the log), then `finish` renames
   the `.swap` files to their final names, indexes first and the log last.

`complete_swaps`, before a log loads, makes either the old or the new segments the
log, never a mix: `.cleaned` files (a pass not committed) go; each `<base>.log.swap`
replaces every segment whose base lies in [base, its next offset), whatever name that
segment's files have reached; its indexes keep their new names if they have them, and
are rebuilt by the load otherwise. A cleaned segment ends where the last segment it
replaces ended (the cleaner keeps that last batch), so that range is all of them.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from tierbroker.protocol.records import BATCH_HEADER_SIZE, BatchView

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
_SEGMENT_FILES = (".index", ".timeindex", ".txnindex", ".log")  # the order of renames: the log last
_SEGMENT_FILE = re.compile(r"([0-9]{20})\.(log|index|timeindex|txnindex)(\.deleted|\.cleaned)?")


def _path(directory: Path, base_offset: int, suffix: str, extra: str = "") -> Path:
    return directory / f"{base_offset:020d}{suffix}{extra}"


def commit(directory: Path, base_offset: int) -> None:
    """Step 2: from here on, the new segment at `base_offset` replaces the old ones."""
    for suffix in _SEGMENT_FILES:
        cleaned = _path(directory, base_offset, suffix, CLEANED_SUFFIX)
        if cleaned.exists() or suffix == ".log":  # an index nothing was added to is absent
            os.rename(cleaned, _path(directory, base_offset, suffix, SWAP_SUFFIX))


def finish(directory: Path, base_offset: int) -> None:
    """Step 3, once the replaced segments are renamed away."""
    for suffix in _SEGMENT_FILES:
        swap = _path(directory, base_offset, suffix, SWAP_SUFFIX)
        if swap.exists() or suffix == ".log":
            os.rename(swap, _path(directory, base_offset, suffix))


def discard(directory: Path, base_offset: int) -> None:
    """Remove a new segment's files that were not committed (the log changed meanwhile)."""
    for suffix in _SEGMENT_FILES:
        _path(directory, base_offset, suffix, CLEANED_SUFFIX).unlink(missing_ok=True)


def complete_swaps(directory: Path) -> None:
    """Make the directory hold whole segments only: see the module docstring."""
    for cleaned in directory.glob(f"*{CLEANED_SUFFIX}"):
        cleaned.unlink()
    for swap in sorted(directory.glob(f"*.log{SWAP_SUFFIX}")):
        base = int(swap.name[:20])
        end = _next_offset(swap, base)
        for path in directory.iterdir():
            match = _SEGMENT_FILE.fullmatch(path.name)
            if match and base <= int(match.group(1)) < end:
                path.unlink()
        finish(directory, base)
        log.info("%s: completed the swap of the cleaned segment at %d", directory.name, base)
    for orphan in directory.glob(f"*{SWAP_SUFFIX}"):  # an index whose log was not committed
        orphan.unlink()


def _next_offset(path: Path, base_offset: int) -> int:
    """The offset after the last whole batch of a segment file, read from batch headers."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position, next_offset = 0, base_offset
        while position + BATCH_HEADER_SIZE <= size:
            batch = BatchView(os.pread(fd, BATCH_HEADER_SIZE, position))
            if batch.size_in_bytes < BATCH_HEADER_SIZE or position + batch.size_in_bytes > size:
                break
            next_offset = batch.next_offset
            position += batch.size_in_bytes
        return next_offset
    finally:
        os.close(fd)
