"""A tierbroker started as a user starts it: the CLI, as a subprocess, on a free port.

The broker binds free ports itself (port 0) and says which in its ports file; a
restarted broker takes the same ports again."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (for brokers that take ports from one
    up, as `serve --brokers N` does)."""
    while True:
        first = free_port()
        sockets = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()


def api_versions_answered(port: int, timeout_s: float = 0.5, tls: bool = False) -> bool:
    """True once the broker answers an ApiVersions v0 request (over TLS, its certificate
    unchecked, if `tls`: a SASL listener answers it before authentication too)."""
    request = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as raw:
            if not tls:
                raw.sendall(struct.pack(">i", len(request)) + request)
                return len(raw.recv(4)) == 4
            unchecked = ssl.create_default_context()
            unchecked.check_hostname = False
            unchecked.verify_mode = ssl.CERT_NONE
            with unchecked.wrap_socket(raw) as s:
                s.sendall(struct.pack(">i", len(request)) + request)
                return len(s.recv(4)) == 4
    except OSError:
        return False


def executable(name: str, install: str) -> str:
    """A command of this virtualenv (or the PATH); a failure says how to install it."""
    exe = Path(sys.executable).with_name(name)
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: run `make test` ({install})")
    return found


class BrokerProcess:
    def __init__(
        self,
        data_dir: Path,
        overrides: dict[str, str] | None = None,
        *,
        file_limit: int | None = None,
        config: Path | None = ROOT / "config" / "server.properties",
        serve_args: tuple[str, ...] = (),
    ) -> None:
        """`file_limit`: the process's RLIMIT_NOFILE (soft and hard), if given; `config`:
        the `--config` file (None: the built-in defaults); `serve_args`: more options."""
        self.data_dir = data_dir
        self.file_limit = file_limit
        self.config = config
        self.serve_args = serve_args
        self.port = 0  # the ports bound, once started (`port`: the first listener's)
        self.metrics_port = 0
        self.listeners: list[dict[str, object]] = []  # name, security_protocol, host, port
        self.overrides = {
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "log.dirs": str(data_dir / "logs"),
            "metrics.port": "0",
            **(overrides or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "broker.log"
        self.ports_file = data_dir / "ports.json"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> BrokerProcess:
        args = [executable("tierbroker", "pip install -e ."), "serve", *self.serve_args]
        if self.config is not None:
            args += ["--config", str(self.config)]
        args += ["--ports-file", str(self.ports_file)]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        self.ports_file.unlink(missing_ok=True)
        log_file = open(self.log_path, "ab")
        # kio registers hypothesis strategies when hypothesis is installed (it is, for the
        # tests); a shared storage dir keeps it from rebuilding its cache in every temp dir.
        env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(ROOT / ".hypothesis")}
        self.process = subprocess.Popen(
            args,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.data_dir,
            env=env,
            preexec_fn=self._limit_files if self.file_limit is not None else None,
        )
        log_file.close()
        deadline = time.monotonic() + timeout_s
        while not self._read_ports_file() or not api_versions_answered(self.port, tls=self.tls):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"tierbroker exited with {self.process.returncode}:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"tierbroker did not answer within {timeout_s}s:\n{self.log()}")
            time.sleep(0.05)
        return self

    def _read_ports_file(self) -> bool:
        """Take the (first) broker's bound ports from the ports file; False until written."""
        try:
            ports = json.loads(self.ports_file.read_text())[0]
        except FileNotFoundError:
            return False
        self.port, self.metrics_port = ports["port"], ports["metrics_port"]
        self.listeners = ports["listeners"]
        return True

    @property
    def tls(self) -> bool:
        """Whether the first listener (where `port` is) speaks TLS."""
        return str(self.listeners[0]["security_protocol"]).endswith("SSL")

    def _limit_files(self) -> None:
        assert self.file_limit is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.file_limit, self.file_limit))

    def restarted(self, timeout_s: float = 60.0) -> BrokerProcess:
        """A new broker process on the same data dir, ports, overrides and limits, started."""
        same_ports = {
            "listeners": ",".join(f"{x['name']}://{x['host']}:{x['port']}" for x in self.listeners),
            "metrics.port": str(self.metrics_port),
        }
        new = type(self)(
            self.data_dir,
            {**self.overrides, **same_ports},
            file_limit=self.file_limit,
            config=self.config,
            serve_args=self.serve_args,
        )
        return new.start(timeout_s)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send `sig` and wait for the exit code (SIGKILL after the timeout)."""
        assert self.process is not None
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
