"""`Acceptor`: accepts connections on the listening socket within Kafka's connection quotas.

`max.connections` bounds the broker's connections: at the limit the acceptor stops
accepting until one closes, and clients wait in the listen backlog, as Kafka's
acceptor does. So does the open file limit: connections may use only the descriptors
that the logs (the log file cache's share), indexes, checkpoints, the remote tier and
the broker's own connections do not need (`config.connection_limits`, taken at
start); this is also `max.connections`' default. Anyone able to connect can then not
starve the logs of descriptors, which would fail a segment roll. The acceptor says
once when it stops at that bound (again at most once a minute).

`max.connections.per.ip` (and its per-address overrides) bounds one address: a
connection over it is accepted and closed at once, with a log line.

When `accept` fails for want of file descriptors (EMFILE, ENFILE) or memory, the
waiting connection stays in the backlog: the acceptor retries after a pause and
logs one line per `ACCEPT_ERROR_LOG_INTERVAL_S` saying how often it failed, instead
of a traceback per attempt.

The acceptor accepts in its own task once the socket is readable, rather than with
`loop.sock_accept`: on Python 3.11 a `sock_accept` cancelled (the acceptor stopping)
just as a client connects still accepts the connection, then fails to hand it over and
leaks its socket.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from tierbroker.broker.config.connection_limits import ConnectionLimits
from tierbroker.storage.file_cache import soft_file_limit

log = logging.getLogger(__name__)

ACCEPT_RETRY_DELAY_S = 0.1
ACCEPT_ERROR_LOG_INTERVAL_S = 10.0
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
FILE_LIMIT_LOG_INTERVAL_S = 60.0


class ConnectionQuotas:
    """Open connections, per address and in all. Used from the event loop only."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self.per_ip: Counter[str] = Counter()
        self._slot_freed = asyncio.Event()
        self._file_limit_logged_at = float("-inf")

    def try_add(self, ip: str) -> bool:
        """Count a new connection from `ip`; False if `ip` already has its maximum."""
        if self.per_ip[ip] >= self.limits.limit_for(ip):
            return False
        self.per_ip[ip] += 1
        self.total += 1
        return True

    def remove(self, ip: str) -> None:
        self.per_ip[ip] -= 1
        if not self.per_ip[ip]:
            del self.per_ip[ip]
        self.total -= 1
        self._slot_freed.set()

    async def wait_for_slot(self) -> None:
        """Return once fewer than `max.connections` (and the open file limit's share) are open."""
        limits = self.limits
        while self.total >= min(limits.max_connections, limits.max_connections_by_file_limit):
            if self.total >= limits.max_connections_by_file_limit:
                self._maybe_log_file_limit()
            self._slot_freed.clear()
            await self._slot_freed.wait()

    def _maybe_log_file_limit(self) -> None:
        now = time.monotonic()
        if now - self._file_limit_logged_at < FILE_LIMIT_LOG_INTERVAL_S:
            return
        self._file_limit_logged_at = now
        log.warning(
            "not accepting connections: %d are open, as many as the open file limit allows "
            "(RLIMIT_NOFILE %d, less %d descriptors kept for logs, indexes and the remote "
            "tier); accepting again when one closes (raise the limit, ulimit -n, for more)",
            self.total,
            soft_file_limit(),
            soft_file_limit() - self.limits.max_connections_by_file_limit,
        )


class Acceptor:
    """Accepts from `sock` and hands each admitted connection to `admit`. Owns its task."""

    def __init__(
        self,
        sock: socket.socket,
        quotas: ConnectionQuotas,
        admit: Callable[[socket.socket, str], Awaitable[None]],
    ) -> None:
        self.sock = sock
        self.quotas = quotas
        self.admit = admit
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._logged_at = float("-inf")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="acceptor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.quotas.wait_for_slot()
            try:
                conn, address = await self._accept(loop)
            except ConnectionAbortedError:
                continue  # the client gave up before we accepted: routine
            except OSError as e:
                # Out of file descriptors or memory, mostly: the client waits in the backlog.
                self._note_failure(e)
                await asyncio.sleep(ACCEPT_RETRY_DELAY_S)
                continue
            ip = str(address[0])
            if not self.quotas.try_add(ip):
                log.info(
                    "rejected connection from %s: it has the maximum of %d connections "
                    "(max.connections.per.ip)",
                    ip,
                    self.quotas.limits.limit_for(ip),
                )
                conn.close()
                continue
            try:
                await self.admit(conn, ip)
            except Exception:  # one bad connection must not stop the broker accepting
                log.exception("closing connection from %s: it could not be set up", ip)
                conn.close()

    async def _accept(self, loop: asyncio.AbstractEventLoop) -> tuple[socket.socket, Any]:
        """The next connection, accepted here once the socket is readable."""
        while True:
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                readable = loop.create_future()
                loop.add_reader(self.sock, _set_once, readable)
                try:
                    await readable
                finally:
                    loop.remove_reader(self.sock)
                continue
            conn.setblocking(False)
            return conn, address

    def _note_failure(self, e: OSError) -> None:
        self._failures += 1
        now = time.monotonic()
        if now - self._logged_at >= ACCEPT_ERROR_LOG_INTERVAL_S:
            hint = (
                "; raise the open file limit or lower max.connections"
                if e.errno in _OUT_OF_RESOURCES
                else ""
            )
            log.warning(
                "cannot accept connections: %s (%d times since the last report, retrying "
                "every %.1f s%s)",
                e.strerror or e,
                self._failures,
                ACCEPT_RETRY_DELAY_S,
                hint,
            )
            self._logged_at, self._failures = now, 0


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
