"""Kafka Connect against tierbroker: a standalone worker runs Kafka's quickstart pair,
FileStreamSource and FileStreamSink, through one topic.

The source keeps its position in the worker's offsets file, the sink in its consumer
group (`connect-file-sink`, offsets committed to tierbroker). The worker is stopped and
started again between two halves of the input: every line comes out once, none twice.
Distributed workers keep their state in compacted topics and wait for compaction.
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

from tests.apache_kafka import jars, tool_command
from tests.integration.broker_process import free_port
from tests.integration.waiting import wait_for
from tierbroker.testing import TierbrokerCluster

STANDALONE = "org.apache.kafka.connect.cli.ConnectStandalone"


class Worker:
    """A standalone Connect worker with the two file connectors, in `directory`."""

    def __init__(self, directory: Path, bootstrap: str, topic: str) -> None:
        plugins = directory / "plugins"
        plugins.mkdir()
        for jar in jars().glob("connect-file-*.jar"):
            (plugins / jar.name).symlink_to(jar)
        self.port = free_port()
        self.input, self.output = directory / "in.txt", directory / "out.txt"
        self.input.touch()
        self.log = directory / "worker.log"
        self.files = [
            _properties(
                directory / "worker.properties",
                {
                    "bootstrap.servers": bootstrap,
                    "key.converter": "org.apache.kafka.connect.storage.StringConverter",
                    "value.converter": "org.apache.kafka.connect.storage.StringConverter",
                    "offset.storage.file.filename": str(directory / "offsets"),
                    "offset.flush.interval.ms": "500",
                    "plugin.path": str(plugins),
                    "listeners": f"http://127.0.0.1:{self.port}",
                },
            ),
            _properties(
                directory / "source.properties",
                {
                    "name": "file-source",
                    "connector.class": "FileStreamSource",
                    "file": str(self.input),
                    "topic": topic,
                },
            ),
            _properties(
                directory / "sink.properties",
                {
                    "name": "file-sink",
                    "connector.class": "FileStreamSink",
                    "file": str(self.output),
                    "topics": topic,
                },
            ),
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                tool_command(STANDALONE, *map(str, self.files)), stdout=log, stderr=log
            )
        wait_for(self.running, "both connectors and their tasks RUNNING", 90, 0.25, self.tail)

    def stop(self) -> None:
        """Stop as an operator does (SIGTERM): the worker commits and flushes its offsets."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(60) in (0, 143), self.tail()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def running(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.tail()
        try:
            return all(
                status["connector"]["state"] == "RUNNING"
                and [task["state"] for task in status["tasks"]] == ["RUNNING"]
                for status in map(self.status, ("file-source", "file-sink"))
            )
        except OSError:
            return False  # the REST server is not listening yet

    def status(self, connector: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/connectors/{connector}/status"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.load(answer)

    def append(self, lines: list[str]) -> None:
        with self.input.open("a") as f:
            f.writelines(line + "\n" for line in lines)

    def written(self) -> list[str]:
        return self.output.read_text().splitlines() if self.output.exists() else []

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


def _properties(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def test_file_source_and_sink_carry_every_line_once_across_a_restart(
    shared_tierbroker: TierbrokerCluster, tmp_path: Path
) -> None:
    topic = f"connect-{uuid.uuid4().hex[:8]}"
    shared_tierbroker.create_topic(topic, partitions=3)
    worker = Worker(tmp_path, shared_tierbroker.bootstrap_servers, topic)
    first = [f"first {i}" for i in range(1000)]
    second = [f"second {i}" for i in range(1000)]
    try:
        worker.append(first)
        worker.start()
        wait_for(lambda: len(worker.written()) >= len(first), "the first half", 60, 0.2)
        worker.stop()

        worker.append(second)
        worker.start()
        wait_for(lambda: len(worker.written()) >= len(first + second), "both halves", 60, 0.2)
        worker.stop()
    finally:
        worker.kill()
    assert Counter(worker.written()) == Counter(first + second)
    end = shared_tierbroker.end_offsets(topic)
    assert sum(end.values()) == len(first + second)
    assert shared_tierbroker.committed("connect-file-sink") == {
        (topic, partition): offset for partition, offset in end.items()
    }
