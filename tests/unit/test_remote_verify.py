"""`tierbroker remote verify`'s verdicts over a bucket laid out as the plugins write it."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import crc32c

from tierbroker.broker.cli.remote_bucket import list_partitions, partition_dir
from tierbroker.broker.cli.remote_verify import verify
from tierbroker.pipeline.storage import LocalObjectStore
from tierbroker.storage.checkpoints import kafka_uuid

TOPIC_ID = kafka_uuid(uuid.uuid4())
PREFIX = f"cl/orders-{TOPIC_ID}/0/"
HOUR_MS = 3_600_000


def put(root: Path, key: str, data: bytes, age_ms: int = HOUR_MS) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    when = time.time() - age_ms / 1000
    os.utime(path, (when, when))


def segment(root: Path, base: str, log: bytes, *, crc: bool = True) -> None:
    put(root, PREFIX + base + ".log", log)
    put(root, PREFIX + base + ".indexes", b"ix")
    objects = {
        "log": {"key": PREFIX + base + ".log", "size": len(log)},
        "indexes": {"key": PREFIX + base + ".indexes", "size": 2},
    }
    if crc:
        objects["log"]["crc32c"] = crc32c.crc32c(log)
    put(root, PREFIX + base + ".manifest.json", json.dumps({"objects": objects}).encode())


def problems(root: Path, delete: bool = False) -> tuple[set[tuple[str, str]], list[str]]:
    store = LocalObjectStore(root)
    reports, deleted = verify(store, list_partitions(store), 600_000, delete)
    found = {(p.kind, p.key.removeprefix(PREFIX)) for r in reports for p in r.problems}
    return found, deleted


def test_a_sound_bucket_has_no_problem(tmp_path: Path) -> None:
    segment(tmp_path, "0-a", b"records")
    segment(tmp_path, "7-b", b"more records", crc=False)
    put(tmp_path, PREFIX + "partition.json", b"{}")
    put(tmp_path, "elsewhere/file", b"not a partition's")
    assert problems(tmp_path)[0] == {("index", "partition.json")}


def test_missing_changed_and_orphaned_objects_are_each_reported(tmp_path: Path) -> None:
    segment(tmp_path, "0-a", b"records")
    segment(tmp_path, "7-b", b"more records")
    segment(tmp_path, "19-c", b"last")
    (tmp_path / PREFIX / "0-a.indexes").unlink()
    put(tmp_path, PREFIX + "7-b.log", b"MORE records")  # same size, other bytes
    put(tmp_path, PREFIX + "19-c.log", b"longer")
    put(tmp_path, PREFIX + "30-d.log", b"a crashed copy's")
    put(tmp_path, PREFIX + "31-e.log", b"a copy in flight", age_ms=1000)
    put(tmp_path, PREFIX + "40-f.manifest.json", b"{not json")
    put(tmp_path, PREFIX + "40-f.log", b"next to a bad manifest")
    assert problems(tmp_path)[0] == {
        ("missing", "0-a.indexes"),
        ("crc", "7-b.log"),
        ("size", "19-c.log"),
        ("orphan", "30-d.log"),
        ("manifest", "40-f.manifest.json"),
    }


def test_delete_orphans_deletes_only_them(tmp_path: Path) -> None:
    segment(tmp_path, "0-a", b"records")
    (tmp_path / PREFIX / "0-a.indexes").unlink()
    put(tmp_path, PREFIX + "30-d.log", b"a crashed copy's")
    put(tmp_path, PREFIX + "30-d.indexes", b"ix")
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    found, deleted = problems(tmp_path, delete=True)
    assert sorted(deleted) == [PREFIX + "30-d.indexes", PREFIX + "30-d.log"]
    after = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert [p for p in before if p not in after] == sorted(tmp_path / k for k in deleted)
    assert problems(tmp_path)[0] == {("missing", "0-a.indexes")}
    assert ("orphan", "30-d.log") in found


def test_a_partition_prefix_is_found_with_or_without_entropy() -> None:
    plain = partition_dir("p/", f"p/cl/my-topic-{TOPIC_ID}/3/0-a.log")
    hashed = partition_dir("p/", f"p/a7/cl/my-topic-{TOPIC_ID}/3/0-a.log")
    assert plain is not None and hashed is not None
    assert (plain.topic, plain.partition, plain.cluster) == ("my-topic", 3, "cl")
    assert hashed.prefix == f"p/a7/cl/my-topic-{TOPIC_ID}/3/"
    assert partition_dir("p/", "p/cl/no-id/3/0-a.log") is None
