"""`ObjectKeyLayout`: the one place that names the objects of the remote tier.

    <prefix><entropy>/<cluster>/<topic>-<topic id>/<partition>/<start offset>-<segment id>.<suffix>

(the start offset in 20 digits, ids in Kafka's base64url form)

Beside the segments, each partition's prefix holds one `partition.json`, its
`PartitionIndex` (`partition_index`).

Suffixes: `log`, `indexes` (every index of the segment in one object, see
`index_bundle`), and `manifest.json` last. With `entropy_bits` N > 0, `<entropy>` is
the first N bits of MD5("<cluster>/<topic>/<partition>") as hex followed by `/`,
so the request load of many partitions spreads over 2^N key prefixes (the
Pinterest layout); every reader must use the same N.

The manifest is a small JSON document: the segment's metadata and, per object, its
key, its size and CRC32C as stored, and how it is stored (`segment_codec.StoredFormat`:
as written, or in compressed and encrypted chunks). A plugin writes it after every
other object of the segment; a segment without a manifest is incomplete and is
ignored by readers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tierbroker.storage.checkpoints import kafka_uuid
from tierbroker.storage.remote.partition_index import PARTITION_INDEX_NAME
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata, TopicIdPartition

MANIFEST_SUFFIX = "manifest.json"
LOG_SUFFIX = "log"
INDEXES_SUFFIX = "indexes"
MANIFEST_VERSION = 3  # 2: the indexes in one object; 3: CRC32C and stored formats


@dataclass(frozen=True, slots=True)
class ObjectKeyLayout:
    prefix: str = ""
    entropy_bits: int = 0
    cluster: str = "cluster"

    def __post_init__(self) -> None:
        if not 0 <= self.entropy_bits <= 32:
            raise ValueError(f"entropy bits must be 0..32, got {self.entropy_bits}")

    def entropy(self, topic: str, partition: int) -> str:
        if self.entropy_bits == 0:
            return ""
        digest = hashlib.md5(f"{self.cluster}/{topic}/{partition}".encode(), usedforsecurity=False)
        value = int.from_bytes(digest.digest()[:4], "big") >> (32 - self.entropy_bits)
        return f"{value:0{(self.entropy_bits + 3) // 4}x}/"

    def partition_prefix(self, tip: TopicIdPartition) -> str:
        tp = tip.topic_partition
        return (
            f"{self.prefix}{self.entropy(tp.topic, tp.partition)}{self.cluster}/"
            f"{tp.topic}-{kafka_uuid(tip.topic_id)}/{tp.partition}/"
        )

    def partition_index_key(self, tip: TopicIdPartition) -> str:
        return self.partition_prefix(tip) + PARTITION_INDEX_NAME

    def segment_key(self, metadata: RemoteLogSegmentMetadata, suffix: str) -> str:
        segment = metadata.segment_id
        base = f"{metadata.start_offset:020d}-{kafka_uuid(segment.id)}"
        return f"{self.partition_prefix(segment.topic_id_partition)}{base}.{suffix}"

    def all_keys(self, metadata: RemoteLogSegmentMetadata) -> list[str]:
        """Every object of a segment, the manifest last (the order to write them in)."""
        return [
            self.segment_key(metadata, suffix)
            for suffix in (LOG_SUFFIX, INDEXES_SUFFIX, MANIFEST_SUFFIX)
        ]


def manifest_json(
    metadata: RemoteLogSegmentMetadata, layout: ObjectKeyLayout, entries: dict[str, dict[str, Any]]
) -> bytes:
    """The manifest of a copied segment: its metadata and each object's entry (its size,
    CRC32C and stored format), keyed by suffix."""
    document: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "segment": metadata.to_json(),
        "objects": {
            suffix: {"key": layout.segment_key(metadata, suffix), **entry}
            for suffix, entry in entries.items()
        },
    }
    return json.dumps(document, sort_keys=True).encode()
