"""`tierbroker remote verify`: scrub a bucket of the remote tier.

For every partition prefix (`remote_bucket`), each segment manifest's objects must
exist with the size it records, and with its CRC32C where it records one (`crc32c`, of
the object's bytes as stored: the object is read whole to check it; older manifests
have sizes only). Problems, each one row:

- `missing`: an object a manifest names is not there (the segment is unreadable);
- `size`, `crc`: it is there, with other bytes;
- `manifest`, `index`: a manifest or the partition index that does not parse;
- `orphan`: an object no manifest names (a crashed copy's leftovers), older than the
  grace period: a younger one may belong to a copy in flight, whose manifest comes
  last. The objects of a manifest that does not parse are never orphans.

`--delete-orphans` deletes the orphans, and nothing else: never an object a manifest
names, a manifest, or an index.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import crc32c

from tierbroker.broker.cli.remote_bucket import MANIFEST_END, PartitionDir, manifests
from tierbroker.pipeline.storage import ObjectInfo, ObjectNotFoundError, ObjectStore
from tierbroker.storage.remote.partition_index import PartitionIndex

CRC_READ_BYTES = 8 << 20  # an object is checked a range at a time


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # missing, size, crc, manifest, index, orphan
    key: str
    detail: str


@dataclass(slots=True)
class PartitionReport:
    where: PartitionDir
    segments: int = 0
    bytes: int = 0  # of the objects the manifests name
    has_index: bool = False
    problems: list[Problem] = field(default_factory=list)


def crc32c_of(store: ObjectStore, key: str, size: int) -> int:
    """The CRC32C of an object, read a range at a time."""
    crc = 0
    for start in range(0, size, CRC_READ_BYTES):
        crc = crc32c.crc32c(store.get(key, start, min(start + CRC_READ_BYTES, size)), crc)
    return crc


def check_partition(
    store: ObjectStore,
    where: PartitionDir,
    objects: Sequence[ObjectInfo],
    now_ms: int,
    grace_ms: int,
) -> PartitionReport:
    """What is wrong in one partition prefix, from its listed `objects`."""
    report = PartitionReport(where)
    listed = {o.key: o for o in objects}
    named: set[str] = set()
    for manifest in manifests(objects):
        named.add(manifest.key)
        try:
            entries = _manifest_objects(store.get(manifest.key))
        except ObjectNotFoundError:
            continue  # deleted since the listing: the segment is being deleted
        except ValueError as e:
            report.problems.append(Problem("manifest", manifest.key, f"does not parse: {e}"))
            base = manifest.key.removesuffix(MANIFEST_END)
            named.update(k for k in listed if k.split(".", 1)[0] == base)
            continue
        report.segments += 1
        for key, size, crc in entries:
            named.add(key)
            report.bytes += size
            report.problems.extend(_check_object(store, listed.get(key), key, size, crc))
    index = listed.get(where.index_key)
    if index is not None:
        named.add(index.key)
        report.has_index = True
        try:
            PartitionIndex.from_json(store.get(index.key), index.key)
        except ValueError as e:
            report.problems.append(Problem("index", index.key, str(e)))
        except ObjectNotFoundError:
            report.has_index = False
    for o in objects:
        if o.key not in named and o.last_modified_ms <= now_ms - grace_ms:
            report.problems.append(Problem("orphan", o.key, f"{o.size} bytes, in no manifest"))
    return report


def _manifest_objects(document: bytes) -> list[tuple[str, int, int | None]]:
    """(key, size, CRC32C or None) of each object a manifest names; ValueError if it does
    not parse."""
    try:
        objects = json.loads(document)["objects"]
        return [
            (
                str(entry["key"]),
                int(entry["size"]),
                None if entry.get("crc32c") is None else int(entry["crc32c"]),
            )
            for entry in objects.values()
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"no {e}") from None


def _check_object(
    store: ObjectStore, found: ObjectInfo | None, key: str, size: int, crc: int | None
) -> list[Problem]:
    if found is None:
        return [Problem("missing", key, f"named by its manifest ({size} bytes)")]
    if found.size != size:
        return [Problem("size", key, f"{found.size} bytes, its manifest says {size}")]
    if crc is not None:
        try:
            actual = crc32c_of(store, key, size)
        except ObjectNotFoundError:
            return [Problem("missing", key, f"named by its manifest ({size} bytes)")]
        if actual != crc:
            return [Problem("crc", key, f"CRC-32 {actual}, its manifest says {crc}")]
    return []


def verify(
    store: ObjectStore,
    partitions: dict[PartitionDir, list[ObjectInfo]],
    grace_ms: int,
    delete_orphans: bool,
) -> tuple[list[PartitionReport], list[str]]:
    """Check every partition; with `delete_orphans`, delete them. The reports, and the
    keys deleted."""
    now_ms = int(time.time() * 1000)
    reports = [check_partition(store, w, objs, now_ms, grace_ms) for w, objs in partitions.items()]
    deleted: list[str] = []
    if delete_orphans:
        for report in reports:
            for problem in report.problems:
                # An orphan is named by no manifest and is neither a manifest nor the index.
                if problem.kind == "orphan":
                    store.delete(problem.key)
                    deleted.append(problem.key)
    return reports, deleted
