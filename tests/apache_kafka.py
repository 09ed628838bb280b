"""Apache Kafka (the jars `make peers` fetches) on free loopback ports, for tests.

`ApacheKafka(dir).start()` formats a one-node KRaft log dir with Kafka's storage tool,
runs `kafka.Kafka` as broker and controller and waits until it answers ApiVersions;
`stop()` kills it. `run_java` runs a single-file Java program from tests/java and
`run_tool` one of Kafka's command-line tools as its class, both against those jars. A test
that needs them and finds no jars fails with the command that fetches them.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from tests.integration.broker_process import api_versions_answered, free_port

POM = Path(__file__).parent.parent / "peers" / "kafka" / "pom.xml"
INSTALL = "make peers (fetches Apache Kafka's jars with Maven, once per machine)"
JAVA_SOURCES = Path(__file__).parent / "java"


def jars() -> Path:
    """The directory of Kafka's jars, where scripts/install-kafka.sh puts them."""
    pinned = re.search(r"<kafka.version>(.+)</kafka.version>", POM.read_text())
    assert pinned is not None, f"no <kafka.version> in {POM}"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    default = cache / "tierbroker" / f"kafka-{pinned.group(1)}"
    directory = Path(os.environ.get("TIERBROKER_KAFKA_JARS", default))
    if not (directory / ".complete").exists():
        raise RuntimeError(f"Apache Kafka's jars are not in {directory}: {INSTALL}")
    return directory


# Tools and programs run for seconds: the JIT's first tier only costs them a third less CPU.
SHORT_RUN = ("-Xmx256m", "-XX:TieredStopAtLevel=1")


def _java(*args: str, options: tuple[str, ...] = SHORT_RUN) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no Java runtime: apt-get install -y openjdk-17-jdk-headless")
    return [java, *options, "-cp", f"{jars()}/*", *args]


def run_tool(tool: str, *args: str, timeout_s: float = 60.0) -> str:
    """Run Kafka's command-line tool `tool` (a class in org.apache.kafka.tools) and
    return its standard output; fail with its output if it exits non-zero."""
    return _run(_java(f"org.apache.kafka.tools.{tool}", *args), timeout_s)


def run_java(source: str, *args: str, timeout_s: float = 120.0) -> str:
    """Run tests/java/`source` (a single-file Java program) and return its standard
    output; fail with its output if it exits non-zero."""
    return _run(_java(str(JAVA_SOURCES / source), *args), timeout_s)


def _run(command: list[str], timeout_s: float) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command[1:])} exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


class ApacheKafka:
    """One Apache Kafka node in KRaft mode (broker and controller) in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.controller_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ApacheKafka:
        config = self._write_config()
        _run(
            _java(
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                _cluster_id(),
                "-c",
                str(config),
            ),
            timeout_s,
        )
        with open(self.dir / "kafka.log", "wb") as log:
            self.process = subprocess.Popen(
                _java("kafka.Kafka", str(config), options=("-Xmx768m",)),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while not api_versions_answered(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Apache Kafka did not start on port {self.port}:\n{self.log()}")
            time.sleep(0.1)
        return self

    def _write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "server.properties"
        controller = f"127.0.0.1:{self.controller_port}"
        # One node: internal topics with one replica, groups that rebalance at once.
        config.write_text(
            "process.roles=broker,controller\n"
            "node.id=1\n"
            f"controller.quorum.bootstrap.servers={controller}\n"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://{controller}\n"
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}\n"
            "controller.listener.names=CONTROLLER\n"
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n"
            f"log.dirs={self.dir / 'data'}\n"
            "offsets.topic.replication.factor=1\n"
            "offsets.topic.num.partitions=5\n"
            "transaction.state.log.replication.factor=1\n"
            "transaction.state.log.min.isr=1\n"
            "share.coordinator.state.topic.replication.factor=1\n"
            "share.coordinator.state.topic.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\n"
        )
        return config

    def log(self) -> str:
        return (self.dir / "kafka.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding, as
    `kafka-storage random-uuid` prints; never starting with '-' (Kafka's Uuid.randomUuid
    rule), which the storage tool would read as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id
