"""The cost meter against an object store's own count: a broker with the S3 plugin on moto's
server tiers two topics and serves them from offset 0; its per-topic requests (`/tier/usage`,
Prometheus) must be the requests moto logged for each topic's keys, its uploaded bytes the
sizes stored. Then `tierbroker tier status --cost` prices them."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess, executable
from tests.integration.moto_server import MotoServer
from tests.integration.tiering_helpers import all_status, metric, metrics
from tests.integration.waiting import wait_for
from tierbroker.broker.cli.prices import DEFAULTS, GB

BUCKET = "cost-meter"
RACK = "az1"
TOPICS = {"cost-a": 3000, "cost-b": 5000}  # records of 500 bytes each
TIERED = {
    "remote.storage.enable": "true",
    "segment.bytes": str(256 * 1024),
    "local.retention.bytes": str(512 * 1024),
}
TOPIC_ID_CHARS = 22  # Kafka's base64url topic id in a key: <topic>-<id>


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer().start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def broker(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker in rack az1 that has tiered both topics and served them whole to a
    consumer of its rack, and has gone quiet (every rolled segment copied)."""
    overrides = {
        **moto.rsm_overrides(BUCKET),
        "broker.rack": RACK,
        "remote.log.manager.task.interval.ms": "300",
        "log.retention.check.interval.ms": "300",
    }
    process = BrokerProcess(tmp_path_factory.mktemp("cost"), overrides).start()
    admin = AdminClient({"bootstrap.servers": process.bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1, config=TIERED) for t in TOPICS]).values():
        future.result(15)
    producer = Producer({"bootstrap.servers": process.bootstrap, "linger.ms": 5})
    for topic, count in TOPICS.items():
        for i in range(count):
            producer.produce(topic, b"x" * 500, b"%d" % i, partition=0)
            producer.poll(0)
    assert producer.flush(60) == 0
    wait_for(
        lambda: (
            all(
                r["copy_lag_segments"] == 0 and r["local_log_start_offset"] > 0
                for r in all_status(process)
                if r["topic"] in TOPICS
            )
            and {r["topic"] for r in all_status(process)} >= TOPICS.keys()
        ),
        "both topics tiered and deleted locally below the remote tier's end",
    )
    for topic, count in TOPICS.items():
        assert read_all(process, topic) == count
    yield process
    process.stop()
    assert "Traceback" not in process.log(), process.log()


def read_all(broker: BrokerProcess, topic: str) -> int:
    """Records read from offset 0 by a consumer in the broker's rack (remote reads first)."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "cost",
            "enable.auto.commit": False,
            "client.rack": RACK,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    read = 0
    deadline = time.monotonic() + 90
    try:
        while read < TOPICS[topic] and time.monotonic() < deadline:
            read += sum(1 for m in consumer.consume(2000, 0.3) if m.error() is None)
    finally:
        consumer.close()
    return read


def kind(method: str, path: str) -> str:
    """The billing class of an S3 request, from its method and query."""
    query = urlsplit(path).query
    if method == "DELETE" or (method == "POST" and "delete" in parse_qs(query, True)):
        return "delete"
    if method == "GET" and "uploads" in parse_qs(query, True):
        return "list"
    return "get" if method in ("GET", "HEAD") else "put"


def topic_of(path: str) -> str | None:
    """The topic whose objects a request names: in its key (`/<bucket>/<cluster>/<topic>-<id>/
    ...`) or its listing prefix; None for requests about the bucket alone."""
    parts = urlsplit(path)
    key = parts.path.split("/", 2)[2] if parts.path.count("/") >= 2 else ""
    key = key or parse_qs(parts.query).get("prefix", [""])[0]
    names = key.split("/")
    return names[1][: -TOPIC_ID_CHARS - 1] if len(names) > 2 else None


def moto_counts(moto: MotoServer) -> dict[str, dict[str, int]]:
    counted: dict[str, Counter[str]] = {t: Counter() for t in TOPICS}
    for method, path in moto.requests():
        topic = topic_of(path)
        if topic in counted:
            counted[topic][kind(method, path)] += 1
    return {t: {k: c[k] for k in ("put", "get", "list", "delete")} for t, c in counted.items()}


def usage(broker: BrokerProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{broker.metrics_port}/tier/usage"
    with urllib.request.urlopen(url, timeout=10) as response:
        topics: dict[str, Any] = json.loads(response.read())["topics"]
    return topics


def test_requests_per_topic_match_the_object_stores_request_log(
    broker: BrokerProcess, moto: MotoServer
) -> None:
    # Reads ahead may still be on their way: the two counts meet once they are answered.
    wait_for(
        lambda: {t: usage(broker)[t]["requests"] for t in TOPICS} == moto_counts(moto),
        "the broker's counts to match moto's request log",
        30,
        show=lambda: (usage(broker), moto_counts(moto)),
    )
    counted = usage(broker)
    assert counted["cost-b"]["requests"]["put"] > counted["cost-a"]["requests"]["put"] > 0
    assert all(counted[t]["requests"]["get"] > 0 for t in TOPICS)
    text = metrics(broker)
    for topic in TOPICS:
        for k, n in counted[topic]["requests"].items():
            sample = metric(text, "RemoteStorageRequestsPerSec_total", topic=topic, kind=k)
            assert sample == n or (n == 0 and sample is None), (topic, k, sample)

    # Uploaded bytes: every object stored, once (nothing was retried or deleted).
    stored: Counter[str] = Counter()
    for page in moto.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for o in page.get("Contents", []):
            stored[topic_of(f"/{BUCKET}/{o['Key']}") or ""] += o["Size"]
    for topic in TOPICS:
        assert counted[topic]["object_store_bytes"]["upload"] == stored[topic]
        assert counted[topic]["object_store_bytes"]["download"] > 0
        # The consumer is in the broker's rack: nothing crossed racks; both tiers served.
        served = counted[topic]["bytes_out"]
        assert served["remote"]["same-rack"] > 0 and served["local"]["same-rack"] > 0
        assert served["remote"]["cross-rack"] == served["local"]["cross-rack"] == 0
        assert (
            metric(
                text,
                "BytesOutByTierPerSec_total",
                topic=topic,
                tier="remote",
                direction="same-rack",
            )
            == (served["remote"]["same-rack"])
        )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [executable("tierbroker", "pip install -e ."), "tier", "status", "--cost", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=60,
    )


def test_tier_status_cost_prices_each_topic(broker: BrokerProcess, tmp_path: Path) -> None:
    url = f"--url=http://127.0.0.1:{broker.metrics_port}"
    done = cli(url, "--output", "json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["price_table"] == "s3-standard"
    rows = {r["topic"]: r for r in shown["topics"]}
    s3 = DEFAULTS["s3-standard"]
    for topic in TOPICS:
        row = rows[topic]
        requests = row["requests"]
        expected = (
            requests["put"] * s3.put_per_1000
            + requests["get"] * s3.get_per_1000
            + requests["list"] * s3.list_per_1000
        ) / 1000
        assert row["cost_usd"]["requests"] == pytest.approx(expected)
        assert row["cost_usd"]["transfer"] == 0  # same rack, and S3 Standard's bytes are free
        assert row["cost_usd"]["storage_per_month"] == pytest.approx(
            row["remote_bytes"] * s3.storage_per_gb_month / GB
        )
        assert row["remote_bytes"] > 0

    table = cli(url, "--price-table", "gcs-standard", "--topic", "cost-a")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("remote storage: healthy")
    assert any("gcs-standard" in line for line in lines)
    assert "cost-a" in table.stdout and "cost-b" not in table.stdout
    assert all(len(line) <= 80 for line in lines), table.stdout

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"s3-standard": {"put_per_1000": 1000.0}}))
    dear = json.loads(cli(url, "--prices", str(prices), "--output", "json").stdout)
    puts = {r["topic"]: r["requests"]["put"] for r in dear["topics"]}
    for row in dear["topics"]:
        assert row["cost_usd"]["requests"] >= puts[row["topic"]]  # a dollar a PUT

    unknown = cli(url, "--price-table", "r2")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("error: ") and "s3-express-one-zone" in unknown.stderr
    assert unknown.stderr.count("\n") == 1
