"""A real ZooKeeper (Debian's `zookeeper` package) on a free loopback port, for tests.

`ZooKeeperServer(dir).start()` writes a `zoo.cfg`, runs QuorumPeerMain on the installed
Java and waits until the `srvr` four-letter command answers; `stop()` kills it. A test
that needs it and finds no ZooKeeper fails with the command that installs it.
`BlackHoleProxy` stands between a client and ZooKeeper and can stop relaying without
closing anything, as a network partition does.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from tests.integration.broker_process import free_port

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
INSTALL = "apt-get install -y zookeeper (Debian's package; `make test` installs it)"


class ZooKeeperServer:
    def __init__(self, directory: Path, tick_time_ms: int = 500) -> None:
        self.dir = directory
        self.port = free_port()
        self.tick_time_ms = tick_time_ms
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ZooKeeperServer:
        java = shutil.which("java")
        if not ZOOKEEPER_JAR.exists() or java is None:
            raise RuntimeError(f"ZooKeeper is not installed: {INSTALL}")
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.dir / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick_time_ms}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "maxSessionTimeout=60000\n"
            "4lw.commands.whitelist=srvr\n"
        )
        classpath = f"{ZOOKEEPER_JAR}:/usr/share/java/*:/etc/zookeeper/conf"
        with open(self.dir / "zookeeper.log", "wb") as log:
            self.process = subprocess.Popen(
                [
                    java,
                    "-Xmx256m",
                    "-cp",
                    classpath,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    str(config),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = (self.dir / "zookeeper.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"ZooKeeper did not start on port {self.port}:\n{log}")
            time.sleep(0.1)
        return self

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"srvr")
                return b"Zookeeper version" in s.recv(1024)
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class BlackHoleProxy:
    """A TCP relay to `target`; `black_hole()` stops relaying both ways, `heal()` resets the
    held connections, so the client reconnects."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.relaying = threading.Event()
        self.relaying.set()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.relaying.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            self.relaying.wait()
            try:
                sink.sendall(data)
            except OSError:
                return

    def black_hole(self) -> None:
        self.relaying.clear()

    def heal(self) -> None:
        with self._lock:
            held, self._sockets = self._sockets, []
        for s in held:
            with contextlib.suppress(OSError):
                s.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                s.close()
        self.relaying.set()

    def close(self) -> None:
        self.heal()
        self.listener.close()
