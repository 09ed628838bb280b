"""`FreeSpaceGuard`: a log dir short of free space refuses produce instead of going offline.

Below `log.dir.min.free.bytes` of free space on its filesystem (tierbroker's own
property; by default the larger of 1 GiB and 5% of the filesystem, 0 turns the guard
off), a log dir's partitions answer produce with KAFKA_STORAGE_ERROR, with one log
line a minute, while reads, DeleteTopics, retention and tiering (local deletion after
upload) go on and free space. Once free space is above the floor again, produce is
accepted, without a restart. An ENOSPC that happens all the same (another writer,
the floor set to 0) still takes the dir offline (`LogDirFailureChannel`).

Free space is read with `statvfs` at most every `FREE_SPACE_CHECK_INTERVAL_S` per
dir, not per produce: between readings the bytes admitted are taken off the last
reading, and a produce that could cross the floor reads it again at once. Used from
the event loop only.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MIN_FREE_BYTES = 1 << 30
DEFAULT_MIN_FREE_SHARE = 0.05  # of the filesystem's size
FREE_SPACE_CHECK_INTERVAL_S = 1.0
REFUSING_LOG_INTERVAL_S = 60.0


@dataclass(slots=True, kw_only=True)
class _DirSpace:
    floor_bytes: int
    headroom_bytes: int = 0  # free bytes above the floor at the last reading, less admitted
    read_at: float = float("-inf")  # monotonic seconds
    refusing: bool = False
    logged_at: float = float("-inf")


class FreeSpaceGuard:
    """Per log dir: may a produce of some bytes be appended, given the free-space floor?"""

    def __init__(self, min_free_bytes: int | None = None) -> None:
        """`min_free_bytes`: the floor; None for the default, 0 for none."""
        self.min_free_bytes = min_free_bytes
        self._dirs: dict[Path, _DirSpace] = {}

    def refusal(self, log_dir: Path, size_bytes: int) -> str | None:
        """None if `size_bytes` may be appended to `log_dir` (then counted as used); else
        why not, for the client's error message."""
        if self.min_free_bytes == 0:
            return None
        try:
            space = self._dirs.get(log_dir)
            if space is None:
                space = self._dirs[log_dir] = _DirSpace(floor_bytes=self._floor_of(log_dir))
            now = time.monotonic()
            # Refused only on a reading: one is taken whenever the bytes admitted since the
            # last would reach the floor (then a refusal is logged), else once a second.
            if now - space.read_at >= FREE_SPACE_CHECK_INTERVAL_S or (
                space.headroom_bytes <= size_bytes and not space.refusing
            ):
                self._read(log_dir, space, now)
        except OSError:
            return None  # the append meets, and reports, what is wrong with the dir
        if space.headroom_bytes <= 0:
            return (
                f"log dir {log_dir} has less free space than log.dir.min.free.bytes "
                f"({space.floor_bytes}): produce is refused until space is freed"
            )
        space.headroom_bytes -= size_bytes
        return None

    def _floor_of(self, log_dir: Path) -> int:
        if self.min_free_bytes is not None:
            return self.min_free_bytes
        st = os.statvfs(log_dir)
        return max(DEFAULT_MIN_FREE_BYTES, int(st.f_blocks * st.f_frsize * DEFAULT_MIN_FREE_SHARE))

    def _read(self, log_dir: Path, space: _DirSpace, now: float) -> None:
        st = os.statvfs(log_dir)
        free_bytes = st.f_bavail * st.f_frsize
        space.headroom_bytes, space.read_at = free_bytes - space.floor_bytes, now
        below = space.headroom_bytes <= 0
        if below and now - space.logged_at >= REFUSING_LOG_INTERVAL_S:
            space.logged_at = now
            log.warning(
                "log dir %s has %d bytes free, below log.dir.min.free.bytes (%d): refusing "
                "produce to its partitions (KAFKA_STORAGE_ERROR); reads, topic deletion, "
                "retention and tiering go on",
                log_dir,
                free_bytes,
                space.floor_bytes,
            )
        elif space.refusing and not below:
            log.info(
                "log dir %s has %d bytes free, above log.dir.min.free.bytes (%d): "
                "accepting produce again",
                log_dir,
                free_bytes,
                space.floor_bytes,
            )
            space.logged_at = float("-inf")
        space.refusing = below
