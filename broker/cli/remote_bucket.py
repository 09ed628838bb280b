"""A bucket of the remote tier as `tierbroker remote` sees it: its objects grouped by the
partition prefix they lie under (`storage.remote.key_layout`), from one listing.

    <key prefix>[<entropy>/]<cluster>/<topic>-<topic id>/<partition>/<name>

Entropy directories need no setting: whatever single directory precedes the cluster
is one. Objects elsewhere (not under a partition prefix) belong to no partition and
are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tierbroker.pipeline.storage import ObjectInfo, ObjectStore
from tierbroker.storage.remote.key_layout import MANIFEST_SUFFIX
from tierbroker.storage.remote.partition_index import PARTITION_INDEX_NAME

_TOPIC_DIR = re.compile(r"^(?P<topic>[a-zA-Z0-9._-]+)-(?P<id>[A-Za-z0-9_-]{22})$")
MANIFEST_END = "." + MANIFEST_SUFFIX


@dataclass(frozen=True, slots=True, order=True)
class PartitionDir:
    """One partition prefix: the topic (by name and id) and partition it holds."""

    topic: str
    partition: int
    topic_id: str
    cluster: str
    prefix: str  # the key prefix of its objects, ending in "/"

    @property
    def index_key(self) -> str:
        return self.prefix + PARTITION_INDEX_NAME

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} ({self.topic_id})"


def partition_dir(key_prefix: str, key: str) -> PartitionDir | None:
    """The partition prefix `key` lies in, if it lies in one."""
    if not key.startswith(key_prefix):
        return None
    parts = key[len(key_prefix) :].split("/")
    if len(parts) not in (4, 5) or not parts[-1] or not parts[-2].isdigit():
        return None
    cluster, topic_dir, partition = parts[-4:-1]
    match = _TOPIC_DIR.match(topic_dir)
    if match is None or not cluster:
        return None
    return PartitionDir(
        topic=match["topic"],
        partition=int(partition),
        topic_id=match["id"],
        cluster=cluster,
        prefix=key[: len(key) - len(parts[-1])],
    )


def list_partitions(
    store: ObjectStore, topic: str | None = None
) -> dict[PartitionDir, list[ObjectInfo]]:
    """Every partition prefix in the store (of `topic` only, if given) and its objects."""
    found: dict[PartitionDir, list[ObjectInfo]] = {}
    for info in store.list_objects(store.key_prefix):
        where = partition_dir(store.key_prefix, info.key)
        if where is not None and (topic is None or where.topic == topic):
            found.setdefault(where, []).append(info)
    return dict(sorted(found.items()))


def manifests(objects: Iterable[ObjectInfo]) -> list[ObjectInfo]:
    return [o for o in objects if o.key.endswith(MANIFEST_END)]
