"""Apache Kafka (the jars `make peers` fetches) on free loopback ports, for tests.

`ApacheKafka(dir).start()` formats a one-node KRaft log dir with Kafka's storage tool,
runs `kafka.Kafka` as broker and controller and waits until it answers ApiVersions;
`stop()` kills it. `ApacheKafkaCluster(dir, racks).start()` does the same for three such
nodes (one per rack, a static controller quorum of all three) with Kafka's
`RackAwareReplicaSelector`, for the replication and `client.rack` tests. `run_java` runs a
single-file Java program from tests/java and `run_tool` one of Kafka's command-line tools
as its class, both against those jars. A test that needs them and finds no jars fails
with the command that fetches them.
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


def tool_command(tool: str, *args: str, options: tuple[str, ...] = SHORT_RUN) -> list[str]:
    """The command that runs Kafka's command-line tool `tool` (a class in
    org.apache.kafka.tools, or one named in full: `kafka.` or `org.`) with JVM `options`,
    for a test that runs it in the background."""
    named = tool.startswith(("kafka.", "org."))
    return _java(tool if named else f"org.apache.kafka.tools.{tool}", *args, options=options)


def run_tool(
    tool: str, *args: str, timeout_s: float = 60.0, options: tuple[str, ...] = SHORT_RUN
) -> str:
    """Run Kafka's command-line tool `tool` with JVM `options` and return its standard
    output; fail with its output if it exits non-zero."""
    return _run(tool_command(tool, *args, options=options), timeout_s)


def run_java(
    source: str | Path,
    *args: str,
    timeout_s: float = 120.0,
    options: tuple[str, ...] = SHORT_RUN,
) -> str:
    """Run tests/java/`source` (a single-file Java program; or one named by its path) with
    JVM `options` and return its standard output; fail with its output if it exits
    non-zero."""
    return _run(java_command(source, *args, options=options), timeout_s)


def java_command(source: str | Path, *args: str, options: tuple[str, ...] = SHORT_RUN) -> list[str]:
    """The command that runs tests/java/`source` (a single-file Java program), for a test
    that runs it in the background."""
    return _java(str(JAVA_SOURCES / source), *args, options=options)


def _run(command: list[str], timeout_s: float) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command[1:])} exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


class ApacheKafka:
    """One Apache Kafka node in KRaft mode (broker and controller) in `directory`, its JVM
    run with `jvm_options`, with `properties` added to its server.properties; `startup_s`
    is from spawning it to its first ApiVersions answer.

    Alone by default; `ApacheKafkaCluster` gives it a node id, a rack, and the quorum
    and settings of three nodes."""

    def __init__(
        self,
        directory: Path,
        properties: dict[str, str] | None = None,
        *,
        jvm_options: tuple[str, ...] = ("-Xmx768m",),
        node_id: int = 1,
        rack: str | None = None,
    ) -> None:
        self.dir = directory
        self.properties = properties or {}
        self.jvm_options = jvm_options
        self.node_id = node_id
        self.rack = rack
        self.port = free_port()
        self.controller_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0
        self._launched = 0.0

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def controller(self) -> str:
        return f"127.0.0.1:{self.controller_port}"

    def start(self, timeout_s: float = 60.0) -> ApacheKafka:
        config = self._write_config()
        self.format(config, "--standalone")
        self.launch(config)
        self.wait_started(timeout_s)
        return self

    def format(self, config: Path, *options: str, cluster_id: str | None = None) -> None:
        """Format the log dir with Kafka's storage tool, as `kafka-storage format` does."""
        tool = ("kafka.tools.StorageTool", "format", *options)
        _run(_java(*tool, "-t", cluster_id or _cluster_id(), "-c", str(config)), 60.0)

    def launch(self, config: Path) -> None:
        self._launched = time.perf_counter()
        with open(self.dir / "kafka.log", "wb") as log:
            self.process = subprocess.Popen(
                _java("kafka.Kafka", str(config), options=self.jvm_options),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_started(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while not api_versions_answered(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Apache Kafka did not start on port {self.port}:\n{self.log()}")
            time.sleep(0.01)
        self.startup_s = time.perf_counter() - self._launched

    def _write_config(self, quorum: str = "", extra: str = "") -> Path:
        """server.properties; `quorum`: the static `controller.quorum.voters` of a cluster
        (empty: this node alone, bootstrapped as `--standalone`)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "server.properties"
        voters = (
            f"controller.quorum.voters={quorum}\n"
            if quorum
            else f"controller.quorum.bootstrap.servers={self.controller}\n"
        )
        rack = f"broker.rack={self.rack}\n" if self.rack else ""
        # One node: internal topics with one replica, groups that rebalance at once.
        config.write_text(
            "process.roles=broker,controller\n"
            f"node.id={self.node_id}\n"
            f"{voters}{rack}"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://{self.controller}\n"
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
            f"{extra}" + "".join(f"{key}={value}\n" for key, value in self.properties.items())
        )
        return config

    def log(self) -> str:
        return (self.dir / "kafka.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# Three nodes (after the one-node lines, which they override: the last value counts):
# internal topics replicated on all, consumers in a rack fetch from its replica.
CLUSTER_SETTINGS = (
    "offsets.topic.replication.factor=3\n"
    "transaction.state.log.replication.factor=3\n"
    "share.coordinator.state.topic.replication.factor=3\n"
    "default.replication.factor=3\n"
    "replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector\n"
)


class ApacheKafkaCluster:
    """Apache Kafka nodes in KRaft mode, each broker and controller (node ids from 1, one
    per rack in `racks`), under `directory`, with `properties` added; each JVM run with
    `jvm_options`, by default a 512 MiB heap, which the tests' topics need, so that three
    fit beside the rest on a small machine."""

    def __init__(
        self,
        directory: Path,
        racks: tuple[str, ...] = ("a", "b", "c"),
        jvm_options: tuple[str, ...] = ("-Xmx512m",),
        properties: dict[str, str] | None = None,
    ) -> None:
        self.nodes = [
            ApacheKafka(
                directory / f"node-{i}",
                properties,
                jvm_options=jvm_options,
                node_id=i,
                rack=rack,
            )
            for i, rack in enumerate(racks, start=1)
        ]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes)

    def start(self, timeout_s: float = 90.0) -> ApacheKafkaCluster:
        quorum = ",".join(f"{n.node_id}@{n.controller}" for n in self.nodes)
        cluster_id = _cluster_id()
        try:
            for node in self.nodes:
                # Each node's quorum: the static voters (the controllers form it themselves).
                config = node._write_config(quorum, CLUSTER_SETTINGS)
                node.format(config, cluster_id=cluster_id)
                node.launch(config)
            for node in self.nodes:
                node.wait_started(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


LOCAL_TIERED_STORAGE = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"


def tiered_storage(directory: Path) -> dict[str, str]:
    """Properties that give Apache Kafka a remote tier in `directory/remote`: Kafka's own
    LocalTieredStorage (from its storage module's test jar, loaded from there alone), its
    topic-based metadata manager, and tasks that run every half second instead of every
    30 s (local deletion after a copy included: log retention's first run no longer waits
    30 s)."""
    (test_jar,) = (jars() / "test-jars").glob("kafka-storage-*-test.jar")
    return {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": LOCAL_TIERED_STORAGE,
        "remote.log.storage.manager.class.path": str(test_jar),
        "rsm.config.dir": str(directory / "remote"),
        "remote.log.metadata.manager.listener.name": "PLAINTEXT",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
        "remote.log.manager.task.interval.ms": "500",
        "log.retention.check.interval.ms": "500",
        "log.initial.task.delay.ms": "0",
    }


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding, as
    `kafka-storage random-uuid` prints; never starting with '-' (Kafka's Uuid.randomUuid
    rule), which the storage tool would read as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id
