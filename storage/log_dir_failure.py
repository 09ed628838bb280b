"""`LogDirFailureChannel`: the one place that records a log dir failing, as Kafka's.

An I/O error (ENOSPC, EIO, ...) while writing or syncing a file of a log dir makes
that whole dir offline for the rest of the process's life: its partitions answer
KAFKA_STORAGE_ERROR and nothing is written there again until a restart, when its
logs are recovered. The first failure of a dir is logged in one line naming the
dir and the errno; later ones are not. Listeners (the broker) learn of each new
offline dir, once.

EMFILE and ENFILE are not storage failures: the process (or the system) is short of
file descriptors, the disk is fine. They leave the dir online (the action is retried:
the next append rolls again, the next flush or checkpoint writes again), with one log
line a minute at most. Only while loading a dir do they take it offline, since a dir
loaded in part must not serve. Called from the event loop or from the loading thread;
a listener must be safe to call from either.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
DESCRIPTOR_SHORTAGE_LOG_INTERVAL_S = 60.0


def describe(error: OSError) -> str:
    """`ENOSPC (No space left on device)`: the errno's name and its text."""
    if error.errno is None:
        return str(error)
    name = errno.errorcode.get(error.errno, str(error.errno))
    return f"{name} ({error.strerror})"


def is_out_of_descriptors(error: OSError) -> bool:
    return error.errno in OUT_OF_DESCRIPTORS


class LogDirFailureChannel:
    def __init__(self) -> None:
        self.offline: dict[Path, OSError] = {}  # log dir -> the error that took it offline
        self.listeners: list[Callable[[Path, OSError], object]] = []
        self._shortages = 0  # EMFILE / ENFILE since the last line about them
        self._shortage_logged_at = float("-inf")

    def maybe_add_offline_log_dir(
        self, log_dir: Path, error: OSError, action: str, *, loading: bool = False
    ) -> bool:
        """Record that `log_dir` failed while `action` (e.g. "appending to t-0"), once per
        dir; True if it is offline now. Out of descriptors, it stays online unless `loading`."""
        if log_dir in self.offline:
            return True
        if is_out_of_descriptors(error) and not loading:
            self._note_shortage(log_dir, error, action)
            return False
        self.offline[log_dir] = error
        log.error("log dir %s is offline: %s failed with %s", log_dir, action, describe(error))
        for listener in self.listeners:
            listener(log_dir, error)
        return True

    def _note_shortage(self, log_dir: Path, error: OSError, action: str) -> None:
        self._shortages += 1
        now = time.monotonic()
        if now - self._shortage_logged_at < DESCRIPTOR_SHORTAGE_LOG_INTERVAL_S:
            return
        log.warning(
            "log dir %s stays online: %s failed with %s (%d times since the last report); "
            "the broker is short of file descriptors, not of storage: raise the open file "
            "limit or lower max.connections",
            log_dir,
            action,
            describe(error),
            self._shortages,
        )
        self._shortage_logged_at, self._shortages = now, 0

    def is_offline(self, log_dir: Path) -> bool:
        return log_dir in self.offline
