"""Kafka Connect against tierbroker: a worker runs Kafka's quickstart pair,
FileStreamSource and FileStreamSink, through one topic, standalone and distributed.

The sink keeps its position in its consumer group (`connect-<sink's name>`, offsets
committed to tierbroker). A standalone worker reads its connectors from properties files
and keeps the source's position in an offsets file. A distributed worker is given its
connectors through its REST API and keeps them, the source's position and their status
in its config, offset and status topics, which it creates itself with
cleanup.policy=compact (and refuses to use otherwise). Each worker is stopped (SIGTERM)
and started again between two halves of the input: every line comes out once, none
twice, and the distributed worker finds its connectors again in its config topic.
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tests.apache_kafka import SHORT_RUN, jars, tool_command
from tests.integration.broker_process import free_port
from tests.integration.waiting import wait_for
from tierbroker.testing import TierbrokerCluster

STANDALONE = "org.apache.kafka.connect.cli.ConnectStandalone"
DISTRIBUTED = "org.apache.kafka.connect.cli.ConnectDistributed"
FIRST = [f"first {i}" for i in range(1000)]
SECOND = [f"second {i}" for i in range(1000)]
# Without a log4j2 config Connect logs errors alone: INFO, so that a failure's tail shows
# the worker's rebalances, tasks and offset commits.
LOG_CONFIG = {
    "rootLogger.level": "INFO",
    "rootLogger.appenderRef.stdout.ref": "STDOUT",
    "appender.stdout.type": "Console",
    "appender.stdout.name": "STDOUT",
    "appender.stdout.layout.type": "PatternLayout",
    "appender.stdout.layout.pattern": "[%d] %p %m (%c)%n",
}


class Worker:
    """A Connect worker in `directory` with the two file connectors (named after
    `topic`, so that each test has its own sink group): standalone, given them in
    properties files, or `distributed` (one worker, its group and internal topics named
    after `topic`), given them by `create_connectors`."""

    def __init__(
        self, directory: Path, bootstrap: str, topic: str, *, distributed: bool = False
    ) -> None:
        plugins = directory / "plugins"
        plugins.mkdir()
        for jar in jars().glob("connect-file-*.jar"):
            (plugins / jar.name).symlink_to(jar)
        self.port = free_port()
        self.input, self.output = directory / "in.txt", directory / "out.txt"
        self.input.touch()
        self.log = directory / "worker.log"
        self.log_config = _properties(directory / "log4j2.properties", LOG_CONFIG)
        self.connectors = {
            f"{topic}-file-source": {
                "connector.class": "FileStreamSource",
                "file": str(self.input),
                "topic": topic,
            },
            f"{topic}-file-sink": {
                "connector.class": "FileStreamSink",
                "file": str(self.output),
                "topics": topic,
            },
        }
        self.sink_group = f"connect-{topic}-file-sink"
        settings = {
            "bootstrap.servers": bootstrap,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "offset.flush.interval.ms": "500",
            "plugin.path": str(plugins),
            # The file connectors declare themselves (ServiceLoader manifests): scanning
            # their classes as well, the default, costs each start about 3 s.
            "plugin.discovery": "service_load",
            "listeners": f"http://127.0.0.1:{self.port}",
        }
        self.storage_topics: dict[str, str] = {}
        if distributed:
            self.storage_topics = {
                "config": f"{topic}-configs",
                "offset": f"{topic}-offsets",
                "status": f"{topic}-status",
            }
            self.arguments = [DISTRIBUTED, *self._distributed(directory, settings, topic)]
        else:
            self.arguments = [STANDALONE, *self._standalone(directory, settings)]
        self.process: subprocess.Popen[bytes] | None = None

    def _distributed(self, directory: Path, settings: dict[str, str], topic: str) -> list[str]:
        """The worker's properties: its group, and its internal topics (one replica),
        which it creates itself."""
        settings = {**settings, "group.id": f"{topic}-workers"}
        for kind, name in self.storage_topics.items():
            settings[f"{kind}.storage.topic"] = name
            settings[f"{kind}.storage.replication.factor"] = "1"
        return [str(_properties(directory / "worker.properties", settings))]

    def _standalone(self, directory: Path, settings: dict[str, str]) -> list[str]:
        """The worker's properties (its source offsets in a file), then each connector's."""
        settings = {**settings, "offset.storage.file.filename": str(directory / "offsets")}
        files = [_properties(directory / "worker.properties", settings)] + [
            _properties(directory / f"{name}.properties", {"name": name, **config})
            for name, config in self.connectors.items()
        ]
        return [str(f) for f in files]

    def start(self) -> None:
        """Start the worker and wait until its REST API says it is ready (`/health`)."""
        with self.log.open("ab") as log:
            command = tool_command(
                *self.arguments,
                options=(*SHORT_RUN, f"-Dlog4j2.configurationFile={self.log_config}"),
            )
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        wait_for(self.ready, "the worker ready", 90, 0.25, self.tail)

    def stop(self) -> None:
        """Stop as an operator does (SIGTERM): the worker commits and flushes its offsets."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(60) in (0, 143), self.tail()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.tail()
        try:
            return bool(self.rest("GET", "/health")["status"] == "healthy")
        except OSError:
            return False  # not listening yet, or 503 while it starts

    def create_connectors(self) -> None:
        """Create both connectors through the REST API (a distributed worker's way)."""
        for name, config in self.connectors.items():
            self.rest("POST", "/connectors", {"name": name, "config": config})

    def wait_running(self) -> None:
        wait_for(self.running, "both connectors and their tasks RUNNING", 90, 0.25, self.tail)

    def running(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.tail()
        try:
            return all(
                status["connector"]["state"] == "RUNNING"
                and [task["state"] for task in status["tasks"]] == ["RUNNING"]
                for status in (self.rest("GET", f"/connectors/{c}/status") for c in self.connectors)
            )
        except OSError:
            return False  # not known yet, or a rebalance under way

    def configured(self) -> dict[str, dict[str, str]]:
        """Each connector the worker knows and the config it holds for it (`name` aside)."""
        known = self.rest("GET", "/connectors?expand=info")
        return {
            name: {k: v for k, v in info["info"]["config"].items() if k != "name"}
            for name, info in known.items()
        }

    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.load(answer)

    def append(self, lines: list[str]) -> None:
        with self.input.open("a") as f:
            f.writelines(line + "\n" for line in lines)

    def wait_written(self, lines: list[str], what: str) -> None:
        wait_for(lambda: len(self.written()) >= len(lines), what, 60, 0.2)

    def written(self) -> list[str]:
        return self.output.read_text().splitlines() if self.output.exists() else []

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


def _properties(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def _assert_every_line_once(cluster: TierbrokerCluster, worker: Worker, topic: str) -> None:
    """Each line written once, each record produced once, the sink's group at the end."""
    assert Counter(worker.written()) == Counter(FIRST + SECOND)
    end = cluster.end_offsets(topic)
    assert sum(end.values()) == len(FIRST + SECOND)
    assert cluster.committed(worker.sink_group) == {
        (topic, partition): offset for partition, offset in end.items()
    }


def test_file_source_and_sink_carry_every_line_once_across_a_restart(
    shared_tierbroker: TierbrokerCluster, tmp_path: Path
) -> None:
    topic = f"connect-{uuid.uuid4().hex[:8]}"
    shared_tierbroker.create_topic(topic, partitions=3)
    worker = Worker(tmp_path, shared_tierbroker.bootstrap_servers, topic)
    try:
        worker.append(FIRST)
        worker.start()
        worker.wait_running()
        worker.wait_written(FIRST, "the first half")
        worker.stop()

        worker.append(SECOND)
        worker.start()
        worker.wait_running()
        worker.wait_written(FIRST + SECOND, "both halves")
        worker.stop()
    finally:
        worker.kill()
    _assert_every_line_once(shared_tierbroker, worker, topic)


def test_a_distributed_worker_resumes_from_its_compacted_topics(
    shared_tierbroker: TierbrokerCluster, tmp_path: Path
) -> None:
    topic = f"connect-{uuid.uuid4().hex[:8]}"
    shared_tierbroker.create_topic(topic, partitions=3)
    worker = Worker(tmp_path, shared_tierbroker.bootstrap_servers, topic, distributed=True)
    try:
        worker.append(FIRST)
        worker.start()
        worker.create_connectors()
        worker.wait_running()
        worker.wait_written(FIRST, "the first half")
        worker.stop()

        worker.append(SECOND)
        worker.start()  # the connectors are not posted again: the config topic has them
        worker.wait_running()
        worker.wait_written(FIRST + SECOND, "both halves")
        assert worker.configured() == worker.connectors
        worker.stop()
    finally:
        worker.kill()
    _assert_every_line_once(shared_tierbroker, worker, topic)
    admin = AdminClient({"bootstrap.servers": shared_tierbroker.bootstrap_servers})
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in worker.storage_topics.values()]
    described = admin.describe_configs(resources)
    assert {
        resource.name: future.result(15)["cleanup.policy"].value
        for resource, future in described.items()
    } == dict.fromkeys(worker.storage_topics.values(), "compact")
