"""One log line per failed authentication, naming the user and the client's address, and
at most `LINES_PER_S` a second: a burst of failures (a password guesser) costs the log a
bounded rate; the lines it leaves out are counted in the next one written."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("tierbroker.broker.security.authentication")

LINES_PER_S = 10


class FailureLog:
    """Shared by every connection of the broker (one event loop)."""

    def __init__(self, lines_per_s: int = LINES_PER_S) -> None:
        self.lines_per_s = lines_per_s
        self._second = 0
        self._written = 0  # lines written in `_second`
        self.suppressed = 0  # lines left out since the last written

    def failed(
        self, listener: str, address: str, mechanism: str, user: str, reason: str, reauth: bool
    ) -> None:
        second = int(time.monotonic())
        if second != self._second:
            self._second, self._written = second, 0
        if self._written >= self.lines_per_s:
            self.suppressed += 1
            return
        self._written += 1
        more = f" ({self.suppressed} more failures not logged)" if self.suppressed else ""
        self.suppressed = 0
        log.warning(
            "failed %s from %s on listener %s: user %r, mechanism %s: %s%s",
            "re-authentication" if reauth else "authentication",
            address,
            listener,
            user,
            mechanism or "none",
            reason,
            more,
        )
