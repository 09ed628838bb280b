"""`SocketServer`: accepts Kafka connections and answers their requests in order.

One `KafkaConnection` (a buffered protocol) per client. Frames are received
straight into their buffers and queued to the connection's one request task,
which handles them one at a time, as Kafka does, and writes each response before
reading the next request; clients may pipeline. Frames larger than the
connection's 64 KiB scratch buffer hold memory of the broker-wide `MemoryPool`
(`queued.max.request.bytes`) from their size prefix until their request has been
handled; a connection the pool cannot serve stops reading (is muted, in Kafka's
words) until memory is released. Smaller frames are cut from the scratch buffer,
and a connection stops reading while more than `QUEUED_SCRATCH_FRAME_BYTES` of
them wait, so every connection holds a fixed amount besides what the pool grants.
The request task waits for the socket to drain before the next response.

Records that live in log files are sent with `sendfile` where the event loop
supports it (the stock asyncio loop): straight away as far as the socket takes
them, the rest with `loop.sendfile`; otherwise (TLS, uvloop) read with `os.pread`
a 1 MiB slice at a time, each once the socket has drained, and written.
Parts in memory above 1 MiB (records read from the remote tier) are written a
slice at a time, each once the socket has drained, so the transport does not
copy what the socket cannot take at once.

The server listens on each of the broker's listeners. A listener's connections are
secured as `ListenerSecurity` says: TLS (set up in a task of its own, so a slow handshake
holds up no other accept, and bounded by `ConnectionLimits.ssl_handshake_timeout_s`),
its principal once the handshake is done, and a SASL authenticator. TLS connections
never use `sendfile`, which would write the file's bytes under the TLS layer.

Connections are accepted by `Acceptor` within `max.connections` and
`max.connections.per.ip`; those idle for `connections.max.idle.ms` are closed.

Shutdown order: stop accepting, let each connection finish the request it is
handling, wait up to the timeout, then cancel what is left and close the sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, cast

from tierbroker.broker.config.connection_limits import ConnectionLimits
from tierbroker.broker.config.listeners import Listener, SecurityProtocol
from tierbroker.broker.network.acceptor import Acceptor, ConnectionQuotas
from tierbroker.broker.network.socket_server_metrics import SocketServerMetrics
from tierbroker.broker.security.principal import ANONYMOUS, KafkaPrincipal
from tierbroker.protocol.codec import FileRegion, ResponseBytes, ResponsePart
from tierbroker.protocol.framing import SCRATCH_BYTES, FrameError, FrameReader, pooled_bytes
from tierbroker.protocol.memory_pool import MemoryPool

log = logging.getLogger(__name__)

WRITE_SLICE_BYTES = 1 << 20
QUEUED_SCRATCH_FRAME_BYTES = 2 * SCRATCH_BYTES
LISTEN_BACKLOG = 1024

# Handles one request frame of a connection; returns the response parts, or None to send
# nothing (acks=0), or raises ConnectionClosing to drop the connection.
RequestHandler = Callable[
    [bytes | memoryview, "KafkaConnection"], Awaitable[list[ResponsePart] | None]
]


class Authenticator(Protocol):
    """A connection's authentication (SASL): it takes the connection's frames until
    `complete`, and again when the client re-authenticates."""

    @property
    def complete(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """How connections of each listener are secured: the TLS context of a listener (None:
    in the clear; asked at each accept, so a reloaded keystore serves new connections), the
    principal of a TLS connection once its handshake is done, and the authenticator of a
    SASL connection."""

    ssl_context_for: Callable[[Listener], ssl.SSLContext | None] = lambda _listener: None
    principal_for: Callable[[KafkaConnection], KafkaPrincipal] = lambda _c: ANONYMOUS
    authenticator_for: Callable[[KafkaConnection], Authenticator | None] = lambda _c: None


class ConnectionClosing(Exception):
    """The request cannot be answered; the connection is closed, as Kafka does. A last
    response, if given (a failed authentication's), is sent first; its failure was
    logged where it was found, so the close is not logged again."""

    def __init__(self, message: str, last_response: list[ResponsePart] | None = None) -> None:
        super().__init__(message)
        self.last_response = last_response


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, server: SocketServer, ip: str, listener: Listener) -> None:
        self.server = server
        self.ip = ip
        self.listener = listener
        self.principal = ANONYMOUS  # who the client authenticated as
        self.authenticator: Authenticator | None = None
        # Zero-copy would write plaintext under TLS: only connections in the clear use it.
        self.use_sendfile = server.use_sendfile and not listener.security_protocol.uses_tls
        self.handling = False  # a request of this connection is in its handler
        self.last_active_s = 0.0  # loop time of the last bytes read or response written
        self.reader = FrameReader(server.max_request_bytes, server.memory_pool)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._frames: asyncio.Queue[bytes | memoryview | None] = asyncio.Queue()
        self._queued_scratch_bytes = 0  # queued frames not held in the pool
        # "queue", "memory", "throttle": reading resumes when empty
        self._paused_for: set[str] = set()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._mute_ms = 0  # after the response in hand, read nothing for this long
        self._closing = asyncio.Event()  # ends a mute early
        self._task: asyncio.Task[None] | None = None

    # Transport callbacks: short and synchronous. -------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.last_active_s = asyncio.get_running_loop().time()
        security, metrics = self.server.security, self.server.metrics
        name = self.listener.name
        metrics.connection_creation.labels(name).inc()
        metrics.connection_count.labels(name).inc()
        if self.listener.security_protocol.uses_tls:
            self.principal = security.principal_for(self)
        if self.listener.security_protocol.uses_sasl:
            self.authenticator = security.authenticator_for(self)
        elif not self.transport.is_closing():  # (a TLS principal failing closes it)
            # In the clear or over TLS alone, the connection is authenticated once set up.
            metrics.authenticated(name)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"connection {self.peer}"
        )
        self.server.own_request_task(self._task)
        self.server.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active_s = asyncio.get_running_loop().time()
        try:
            frames = self.reader.buffer_updated(nbytes)
        except FrameError as e:
            log.warning("closing connection from %s: %s", self.peer, e)
            self._close()
            return
        for frame in frames:
            if not pooled_bytes(len(frame)):
                self._queued_scratch_bytes += len(frame)
            self._frames.put_nowait(frame)
        if self._queued_scratch_bytes > QUEUED_SCRATCH_FRAME_BYTES:
            self._pause("queue")
        if self.reader.awaiting_memory_bytes and "memory" not in self._paused_for:
            self._pause("memory")
            self.server.memory_pool.wait(self.reader.awaiting_memory_bytes, self._memory_granted)

    def _memory_granted(self) -> None:
        self.reader.memory_granted()
        self._resume("memory")

    def _pause(self, reason: str) -> None:
        if not self._paused_for and self.transport is not None:
            self.transport.pause_reading()
        self._paused_for.add(reason)

    def _resume(self, reason: str) -> None:
        self._paused_for.discard(reason)
        transport = self.transport
        if not self._paused_for and transport is not None and not transport.is_closing():
            transport.resume_reading()

    def eof_received(self) -> bool | None:
        if self.reader.has_partial_frame:
            log.info("connection from %s closed in the middle of a request", self.peer)
        self._frames.put_nowait(None)
        # Keep the transport open until queued responses are written; TLS has no half-close
        # (asyncio closes a TLS transport at EOF, and warns if asked to keep it).
        return not self.listener.security_protocol.uses_tls

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.metrics.connection_close.labels(self.listener.name).inc()
        self.server.metrics.connection_count.labels(self.listener.name).dec()
        self.server.connection_closed(self)
        if self.reader.awaiting_memory_bytes:
            self.server.memory_pool.cancel(self._memory_granted)
        self.reader.close()
        self._frames.put_nowait(None)
        self._can_write.set()
        self._closing.set()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # The request task. ---------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while (frame := await self._frames.get()) is not None:
                self._dequeued(len(frame))
                self.handling = True
                try:
                    response = await self.server.handler(frame, self)
                finally:
                    self.handling = False
                    # The pool's memory is held until the request has been handled, as in Kafka.
                    self.server.memory_pool.release(pooled_bytes(len(frame)))
                del frame
                if response is not None and not await self._send(response):
                    break
                if self._mute_ms:
                    await self._muted()
        except ConnectionClosing as e:
            if e.last_response is None:
                log.warning("closing connection from %s: %s", self.peer, e)
            else:
                log.debug("closing connection from %s: %s", self.peer, e)
                with contextlib.suppress(ConnectionError):
                    await self._send(e.last_response)
        except ConnectionError as e:  # the client went away mid-response: routine
            log.info("connection from %s lost while answering: %s", self.peer, e)
        except Exception:
            log.exception("closing connection from %s after an unexpected error", self.peer)
        finally:
            self._close()
            self._release_queued()

    def mute_after_response(self, throttle_ms: int) -> None:
        """Read and handle nothing more from this client for `throttle_ms` once the
        response in hand is sent (KIP-219: a client over its quota is answered at once,
        with the throttle time, then muted)."""
        self._mute_ms = max(self._mute_ms, throttle_ms)

    async def _muted(self) -> None:
        mute_s, self._mute_ms = self._mute_ms / 1000, 0
        self._pause("throttle")
        try:
            async with asyncio.timeout(mute_s):
                await self._closing.wait()
        except TimeoutError:
            pass
        finally:
            self._resume("throttle")

    def _dequeued(self, nbytes: int) -> None:
        if not pooled_bytes(nbytes):
            self._queued_scratch_bytes -= nbytes
            if self._queued_scratch_bytes <= QUEUED_SCRATCH_FRAME_BYTES // 2:
                self._resume("queue")

    def _release_queued(self) -> None:
        """Frames never handled give their memory back to the pool."""
        while not self._frames.empty():
            frame = self._frames.get_nowait()
            if frame is not None:
                self.server.memory_pool.release(pooled_bytes(len(frame)))

    async def _send(self, parts: list[ResponsePart]) -> bool:
        transport = self.transport
        assert transport is not None
        for part in parts:
            if transport.is_closing():
                return False
            if isinstance(part, ResponseBytes):
                await self._write(transport, part)
            else:
                await self._send_file(transport, part)
        await self._can_write.wait()
        self.last_active_s = asyncio.get_running_loop().time()
        return not transport.is_closing()

    async def _write(self, transport: asyncio.Transport, data: ResponseBytes) -> None:
        """Write `data`, a large part a slice at a time once the socket has drained: the
        transport copies what the socket does not take at once (twice, before Python 3.12)."""
        if len(data) <= WRITE_SLICE_BYTES:
            transport.write(data)
            return
        view = memoryview(data)
        for start in range(0, len(data), WRITE_SLICE_BYTES):
            await self._can_write.wait()
            if transport.is_closing():
                return
            transport.write(view[start : start + WRITE_SLICE_BYTES])

    async def _send_file(self, transport: asyncio.Transport, region: FileRegion) -> None:
        if self.use_sendfile:
            await self._can_write.wait()
            position, length = region.position, region.length
            sent = self._sendfile_now(transport, region.file.fileno(), position, length)
            if sent < length:
                await asyncio.get_running_loop().sendfile(
                    transport, region.file, position + sent, length - sent
                )
            return
        # A slice at a time, each read once the socket has drained: a region read whole
        # would hold all of it in memory while the TLS layer encrypts a slice at a time.
        end = region.position + region.length
        for position in range(region.position, end, WRITE_SLICE_BYTES):
            await self._can_write.wait()
            if transport.is_closing():
                return
            size = min(WRITE_SLICE_BYTES, end - position)
            data = os.pread(region.file.fileno(), size, position)
            if len(data) < size:  # the file shrank under us: pad so framing stays intact
                data += bytes(size - len(data))
            transport.write(data)

    def _sendfile_now(
        self, transport: asyncio.Transport, fd: int, position: int, length: int
    ) -> int:
        """Bytes of the region the socket took at once, sent straight from the file while
        nothing waits in the transport's buffer (so order is kept); the loop's sendfile,
        which pauses reading and watches the socket twice per call, sends the rest."""
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_write_buffer_size():
            return 0
        try:
            return os.sendfile(sock.fileno(), fd, position, length)
        except (BlockingIOError, InterruptedError):
            return 0

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    async def shutdown(self, timeout_s: float) -> None:
        """Finish the request in hand, then close; cancel after `timeout_s`."""
        self._frames.put_nowait(None)
        self._closing.set()
        task = self._task
        if task is None:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class SocketServer:
    """Listens on each listener, admits connections within `limits`, and closes those idle
    too long."""

    def __init__(
        self,
        handler: RequestHandler,
        max_request_bytes: int,
        max_queued_bytes: int,
        limits: ConnectionLimits | None = None,
        security: ListenerSecurity | None = None,
        metrics: SocketServerMetrics | None = None,
    ) -> None:
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.memory_pool = MemoryPool(max_queued_bytes)
        self.quotas = ConnectionQuotas(limits or ConnectionLimits())
        self.security = security or ListenerSecurity()
        self.metrics = metrics or SocketServerMetrics()
        self.connections: set[KafkaConnection] = set()
        self.use_sendfile = False
        self._sockets: dict[Listener, socket.socket] = {}
        self._acceptors: list[Acceptor] = []
        self._handshakes: set[asyncio.Task[None]] = set()  # TLS connections being set up
        # Each connection's request task until it ends, which may be after the connection
        # was lost (a handler still waiting): `stop` cancels those.
        self._request_tasks: set[asyncio.Task[None]] = set()
        self._idle_task: asyncio.Task[None] | None = None
        self._no_connections = asyncio.Event()

    def listen(self, host: str, port: int) -> None:
        """Listen in the clear on `host`:`port` (port 0: a free one, then in `port`)."""
        self.listen_on(
            socket.create_server((host, port), backlog=LISTEN_BACKLOG),
            Listener("PLAINTEXT", SecurityProtocol.PLAINTEXT, host, port),
        )

    def listen_on(self, sock: socket.socket, listener: Listener) -> None:
        """Listen on `sock`, a bound TCP socket, for `listener` (the preflight binds it
        before the broker loads its logs, so a port in use is found before anything is
        written). Connections wait in the backlog until `start`, as Kafka enables request
        processing once the broker is ready."""
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
        self._sockets[listener] = sock

    async def start(self) -> None:
        """Accept connections and serve their requests."""
        assert self._sockets, "start before listen"
        loop = asyncio.get_running_loop()
        self.use_sendfile = _loop_has_sendfile(loop)
        for listener, sock in self._sockets.items():
            acceptor = Acceptor(sock, self.quotas, partial(self._admit, listener))
            acceptor.start()
            self._acceptors.append(acceptor)
            host, port = sock.getsockname()[:2]
            log.info(
                "listening on %s:%d for %s (%s, sendfile: %s)",
                host,
                port,
                listener.name,
                listener.security_protocol,
                self.use_sendfile and not listener.security_protocol.uses_tls,
            )
        self._idle_task = loop.create_task(self._close_idle_connections(), name="idle-connections")

    async def _admit(self, listener: Listener, sock: socket.socket, ip: str) -> None:
        context = self.security.ssl_context_for(listener)
        if context is None:
            await self._connect(listener, sock, ip, None)
            return
        # A TLS handshake takes round trips: it must not hold up the next accept.
        task = asyncio.get_running_loop().create_task(
            self._connect(listener, sock, ip, context), name=f"TLS handshake {ip}"
        )
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _connect(
        self, listener: Listener, sock: socket.socket, ip: str, context: ssl.SSLContext | None
    ) -> None:
        loop = asyncio.get_running_loop()
        made: list[KafkaConnection] = []  # connection_lost comes once connection_made came

        def connection() -> KafkaConnection:
            made.append(KafkaConnection(self, ip, listener))
            return made[-1]

        # Small response parts (headers before a sendfile) must not wait for an ACK. asyncio
        # sets TCP_NODELAY only on sockets made with proto IPPROTO_TCP, and an accepted
        # socket has the listening socket's proto: 0, from socket.create_server.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if context is None:
                await loop.connect_accepted_socket(connection, sock)
            else:
                await loop.connect_accepted_socket(
                    connection,
                    sock,
                    ssl=context,
                    ssl_handshake_timeout=self.quotas.limits.ssl_handshake_timeout_s,
                )
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            if context is not None and not _set_up(made):  # Kafka: a failed authentication
                # (asyncio's error for a client gone mid-handshake has no message)
                reason = str(e) or type(e).__name__
                self.metrics.authentication_failed(listener.name, ip, f"TLS handshake: {reason}")
            else:
                log.info("connection from %s on %s failed: %s", ip, listener.name, e)
            self._abandon(made, ip, sock)
        except Exception:
            log.exception("closing connection from %s: it could not be set up", ip)
            self._abandon(made, ip, sock)

    def _abandon(self, made: list[KafkaConnection], ip: str, sock: socket.socket) -> None:
        """Close a connection that failed while being set up; until its `connection_made`
        came (after which `connection_lost` does it), it gives its quota slot back here."""
        if not _set_up(made):
            self.quotas.remove(ip)
        sock.close()

    def connection_closed(self, connection: KafkaConnection) -> None:
        self.connections.discard(connection)
        self.quotas.remove(connection.ip)
        if not self.connections:
            self._no_connections.set()

    async def _close_idle_connections(self) -> None:
        """Close connections without a request in hand that read or wrote nothing for
        `connections.max.idle.ms`, as Kafka does; they are looked for every tenth of it."""
        idle_s = self.quotas.limits.connections_max_idle_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(idle_s / 10)
            now = loop.time()
            for c in [c for c in self.connections if not c.handling]:
                if now - c.last_active_s >= idle_s:
                    log.info(
                        "closing connection from %s: idle for more than %d ms "
                        "(connections.max.idle.ms)",
                        c.peer,
                        self.quotas.limits.connections_max_idle_ms,
                    )
                    c._close()

    @property
    def port(self) -> int:
        """The first listener's port."""
        return int(next(iter(self._sockets.values())).getsockname()[1])

    def own_request_task(self, task: asyncio.Task[None]) -> None:
        self._request_tasks.add(task)
        task.add_done_callback(self._request_tasks.discard)

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, let connections finish their current request, then close them;
        requests of connections already lost have no one to answer and are cancelled."""
        if not self._sockets:
            return
        for acceptor in self._acceptors:  # (none when the broker failed before serving)
            await acceptor.stop()
        self._acceptors.clear()
        for task in list(self._handshakes):
            task.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        if self._idle_task is not None:
            self._idle_task.cancel()
            await asyncio.gather(self._idle_task, return_exceptions=True)
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        connections = list(self.connections)
        await asyncio.gather(*(c.shutdown(timeout_s) for c in connections), return_exceptions=True)
        for c in connections:
            c._close()
        orphans = list(self._request_tasks)
        for task in orphans:
            task.cancel()
        await asyncio.gather(*orphans, return_exceptions=True)
        if self.connections:
            self._no_connections.clear()
            await self._no_connections.wait()


def _set_up(made: list[KafkaConnection]) -> bool:
    """Whether the connection being set up got as far as its `connection_made`."""
    return bool(made) and made[0].transport is not None


def _loop_has_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    """uvloop has no loop.sendfile; the stock selector loop sends files natively."""
    return isinstance(loop, asyncio.SelectorEventLoop) and hasattr(os, "sendfile")
