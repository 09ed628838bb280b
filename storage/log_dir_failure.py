"""`LogDirFailureChannel`: the one place that records a log dir failing, as Kafka's.

An I/O error (ENOSPC, EIO, ...) while writing or syncing a file of a log dir makes
that whole dir offline for the rest of the process's life: its partitions answer
KAFKA_STORAGE_ERROR and nothing is written there again until a restart, when its
logs are recovered. The first failure of a dir is logged in one line naming the
dir and the errno; later ones are not. Listeners (the broker) learn of each new
offline dir, once. Called from the event loop or from the loading thread; a
listener must be safe to call from either.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def describe(error: OSError) -> str:
    """`ENOSPC (No space left on device)`: the errno's name and its text."""
    if error.errno is None:
        return str(error)
    name = errno.errorcode.get(error.errno, str(error.errno))
    return f"{name} ({error.strerror})"


class LogDirFailureChannel:
    def __init__(self) -> None:
        self.offline: dict[Path, OSError] = {}  # log dir -> the error that took it offline
        self.listeners: list[Callable[[Path, OSError], object]] = []

    def maybe_add_offline_log_dir(self, log_dir: Path, error: OSError, action: str) -> None:
        """Record that `log_dir` failed while `action` (e.g. "appending to t-0"); once per dir."""
        if log_dir in self.offline:
            return
        self.offline[log_dir] = error
        log.error("log dir %s is offline: %s failed with %s", log_dir, action, describe(error))
        for listener in self.listeners:
            listener(log_dir, error)

    def is_offline(self, log_dir: Path) -> bool:
        return log_dir in self.offline
