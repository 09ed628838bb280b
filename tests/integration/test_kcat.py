"""kcat (Debian's, on librdkafka 2.0.2) against the broker: keyed lines round-trip exactly,
compressed and partitioned produce, headers and nulls, metadata (-L -J), offsets by
timestamp (-Q) and the consumer's start offsets (-o)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess

KCAT_TIMEOUT_S = 60


def kcat(bootstrap: str, *args: str, stdin: str | None = None) -> str:
    """Run kcat against the broker; fail on a non-zero exit or a reported error."""
    exe = shutil.which("kcat")
    if exe is None:
        pytest.fail(
            "kcat is not installed: install it with `apt-get install -y kcat` "
            "(or run `make test`, which does)"
        )
    try:
        done = subprocess.run(
            [exe, "-b", bootstrap, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=KCAT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"kcat {' '.join(args)} did not finish in {KCAT_TIMEOUT_S}s: {e.stderr!r}")
    assert done.returncode == 0, f"kcat {' '.join(args)} exited {done.returncode}: {done.stderr}"
    assert "ERROR" not in done.stderr, done.stderr
    return done.stdout


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def consume(bootstrap: str, topic: str, fmt: str, *extra: str) -> list[str]:
    out = kcat(bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-f", fmt, *extra)
    return out.splitlines()


def test_keyed_lines_round_trip_exactly(broker: BrokerProcess) -> None:
    # The topic does not exist: the producer's metadata request auto-creates it
    # (auto.create.topics.enable=true, num.partitions=1).
    lines = [f"key-{i}:value {i} ünïcödé" for i in range(2000)]
    lines[10] = "key-10:value:with:colons"  # only the first ':' separates the key
    lines[11] = ":empty key"
    lines[12] = "key-12:"  # empty value (not null without -Z)
    kcat(broker.bootstrap, "-P", "-t", "lines", "-K:", stdin="\n".join(lines) + "\n")

    assert consume(broker.bootstrap, "lines", "%k:%s\n") == lines
    # One partition, dense offsets from 0.
    assert consume(broker.bootstrap, "lines", "%p %o\n") == [f"0 {i}" for i in range(2000)]
    # Relative start from the end, and an absolute start with a count.
    tail = kcat(broker.bootstrap, "-C", "-t", "lines", "-e", "-o", "-10", "-f", "%o:%k:%s\n")
    assert tail.splitlines() == [f"{1990 + i}:{line}" for i, line in enumerate(lines[-10:])]
    some = kcat(broker.bootstrap, "-C", "-t", "lines", "-o", "1500", "-c", "5", "-f", "%o:%k:%s\n")
    assert some.splitlines() == [f"{1500 + i}:{lines[1500 + i]}" for i in range(5)]


def test_compressed_produce_across_partitions(broker: BrokerProcess) -> None:
    # Each key twice: the default partitioner sends equal keys to one partition.
    lines = [f"k{i % 500}:v{i}" for i in range(1000)]
    for codec in ["gzip", "snappy", "lz4", "zstd"]:
        topic = f"kcat-{codec}"
        create_topic(broker.bootstrap, topic, 3)
        kcat(
            broker.bootstrap,
            "-P",
            "-t",
            topic,
            "-K:",
            "-X",
            f"compression.codec={codec}",
            "-X",
            "linger.ms=5",
            stdin="\n".join(lines) + "\n",
        )
        by_partition: dict[int, list[tuple[int, str]]] = {}
        for row in consume(broker.bootstrap, topic, "%p|%o|%k:%s\n"):
            p, offset, line = row.split("|", 2)
            by_partition.setdefault(int(p), []).append((int(offset), line))
        assert sorted(line for rows in by_partition.values() for _, line in rows) == sorted(
            lines
        ), codec
        key_partitions: dict[str, set[int]] = {}
        for partition, rows in by_partition.items():
            # Dense offsets, and the partition keeps the order the lines were produced in.
            assert [o for o, _ in rows] == list(range(len(rows))), (codec, partition)
            here = {line for _, line in rows}
            produced = [line for line in lines if line in here]
            assert [line for _, line in rows] == produced, (codec, partition)
            for _, line in rows:
                key_partitions.setdefault(line.split(":")[0], set()).add(partition)
        assert all(len(ps) == 1 for ps in key_partitions.values()), codec
        assert len(by_partition) > 1, f"{codec}: every key went to one partition"


def test_headers_and_null_keys_and_values(broker: BrokerProcess) -> None:
    kcat(
        broker.bootstrap,
        "-P",
        "-t",
        "nulls",
        "-K:",
        "-Z",  # empty keys and values are sent as null
        "-H",
        "first=1",
        "-H",
        "second=",
        stdin="k1:v1\nk2:\n:v3\nk4:a:b\n",
    )
    rows = consume(broker.bootstrap, "nulls", "%o|%k|%K|%s|%S|%h\n", "-Z")
    assert rows == [
        "0|k1|2|v1|2|first=1,second=",
        "1|k2|2|NULL|-1|first=1,second=",
        "2|NULL|-1|v3|2|first=1,second=",
        "3|k4|2|a:b|3|first=1,second=",
    ]


def test_metadata_json_lists_broker_and_partitions(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "meta", 3)
    host, port = broker.bootstrap.split(":")
    for args in [("-L", "-J"), ("-L", "-J", "-t", "meta")]:
        metadata = json.loads(kcat(broker.bootstrap, *args))
        assert metadata["brokers"] == [{"id": 0, "name": f"{host}:{port}"}], metadata
        assert metadata["controllerid"] == 0
        [topic] = [t for t in metadata["topics"] if t["topic"] == "meta"]
        assert "error" not in topic, topic
        assert topic["partitions"] == [
            {"partition": p, "leader": 0, "replicas": [{"id": 0}], "isrs": [{"id": 0}]}
            for p in range(3)
        ]
    listed = json.loads(kcat(broker.bootstrap, "-L", "-J"))
    assert "meta" in {t["topic"] for t in listed["topics"]}


def test_offsets_by_timestamp(broker: BrokerProcess) -> None:
    # Three produce runs some milliseconds apart: kcat stamps records with CreateTime now.
    for run in range(3):
        batch = "".join(f"r{run}-{i}:x\n" for i in range(100))
        kcat(broker.bootstrap, "-P", "-t", "times", "-K:", stdin=batch)
        time.sleep(0.05)
    rows = [row.split("|") for row in consume(broker.bootstrap, "times", "%o|%T|%k\n")]
    stamps = [int(ts) for _, ts, _ in rows]
    assert [int(o) for o, _, _ in rows] == list(range(300))
    second_run = stamps[100]
    assert second_run > stamps[99], "the runs were not stamped apart"
    expected = next(o for o, ts in enumerate(stamps) if ts >= second_run)

    def query(timestamp: int) -> dict[str, object]:
        out = kcat(broker.bootstrap, "-Q", "-J", "-t", f"times:0:{timestamp}")
        return json.loads(out)["times"]["0"]  # type: ignore[no-any-return]

    assert query(second_run) == {"partition": 0, "offset": expected}
    assert query(stamps[0] - 1000) == {"partition": 0, "offset": 0}
    # After the last record Kafka answers -1.
    assert query(max(stamps) + 1) == {"partition": 0, "offset": -1}
    # The consumer starts at the offset for a timestamp (s@) and stops before another (e@).
    window = kcat(
        broker.bootstrap,
        "-C",
        "-t",
        "times",
        "-o",
        f"s@{second_run}",
        "-o",
        f"e@{stamps[200]}",
        "-f",
        "%o\n",
    )
    end = next(o for o, ts in enumerate(stamps) if ts >= stamps[200])
    assert [int(o) for o in window.split()] == list(range(expected, end))
