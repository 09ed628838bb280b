"""ObjectKeyLayout: the key format, prefix entropy (deterministic, per partition, per cluster),
the write order of a segment's objects, and the manifest document."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from tierbroker.storage.checkpoints import kafka_uuid
from tierbroker.storage.remote.key_layout import (
    INDEXES_SUFFIX,
    LOG_SUFFIX,
    MANIFEST_SUFFIX,
    MANIFEST_VERSION,
    ObjectKeyLayout,
    manifest_json,
)
from tierbroker.storage.remote.segment_metadata import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    TopicIdPartition,
)
from tierbroker.storage.topic_partition import TopicPartition

TOPIC_ID = uuid.UUID("0f3c6a2e-8d41-4b6f-9a57-3c2d1e0f4a5b")
SEGMENT_ID = uuid.UUID("5b0e7f1c-2a9d-4c3e-8f60-1d2b3c4d5e6f")
TIP = TopicIdPartition(TOPIC_ID, TopicPartition("orders", 3))


def metadata(
    tip: TopicIdPartition = TIP, start: int = 1234, segment: uuid.UUID = SEGMENT_ID
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, segment),
        start_offset=start,
        end_offset=start + 99,
        max_timestamp_ms=1_700_000_000_000,
        broker_id=2,
        event_timestamp_ms=1_700_000_000_500,
        segment_size_bytes=4096,
        segment_leader_epochs=((0, 0), (3, 1200)),
    )


def md5_bits(text: str, bits: int) -> int:
    """The first `bits` bits of MD5(text), computed independently of the layout."""
    digest = hashlib.md5(text.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest, "big") >> (128 - bits)


def test_key_format_without_entropy() -> None:
    layout = ObjectKeyLayout(prefix="tiered/", cluster="prod-1")
    m = metadata()
    base = f"tiered/prod-1/orders-{kafka_uuid(TOPIC_ID)}/3/00000000000000001234-"
    base += kafka_uuid(SEGMENT_ID)
    assert layout.segment_key(m, LOG_SUFFIX) == base + ".log"
    assert layout.segment_key(m, INDEXES_SUFFIX) == base + ".indexes"
    assert layout.segment_key(m, MANIFEST_SUFFIX) == base + ".manifest.json"
    # Ids are Kafka's base64url, unpadded (22 characters); the offset has 20 digits.
    assert len(kafka_uuid(TOPIC_ID)) == 22 and "=" not in base
    assert layout.entropy("orders", 3) == ""


def test_defaults_and_offsets_sort_as_text() -> None:
    layout = ObjectKeyLayout()
    keys = [layout.segment_key(metadata(start=s), LOG_SUFFIX) for s in (0, 9, 10, 2**40)]
    assert all(k.startswith(f"cluster/orders-{kafka_uuid(TOPIC_ID)}/3/") for k in keys)
    assert keys == sorted(keys)  # zero-padded offsets: listing order is offset order


@pytest.mark.parametrize(("bits", "digits"), [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (32, 8)])
def test_entropy_is_the_first_bits_of_md5_in_hex(bits: int, digits: int) -> None:
    layout = ObjectKeyLayout(entropy_bits=bits, cluster="c1")
    entropy = layout.entropy("orders", 3)
    if bits == 0:
        assert entropy == ""
        return
    assert entropy.endswith("/") and len(entropy) == digits + 1
    assert int(entropy[:-1], 16) == md5_bits("c1/orders/3", bits)
    assert layout.partition_prefix(TIP).startswith(entropy + "c1/orders-")


@pytest.mark.parametrize("bits", [0, 4, 8])
def test_entropy_is_deterministic_and_the_same_for_every_segment_of_a_partition(
    bits: int,
) -> None:
    layout = ObjectKeyLayout(prefix="p/", entropy_bits=bits, cluster="c1")
    again = ObjectKeyLayout(prefix="p/", entropy_bits=bits, cluster="c1")
    keys = {
        layout.segment_key(metadata(start=s, segment=uuid.uuid4()), LOG_SUFFIX)
        for s in (0, 100, 5_000)
    }
    prefixes = {k.split("/c1/")[0] for k in keys}
    assert len(prefixes) == 1  # all segments of a partition share the prefix
    assert layout.partition_prefix(TIP) == again.partition_prefix(TIP)
    # The entropy hashes the topic name, not its id: a recreated topic lands alike.
    recreated = TopicIdPartition(uuid.uuid4(), TIP.topic_partition)
    assert layout.entropy("orders", 3) == again.entropy(
        recreated.topic_partition.topic, recreated.topic_partition.partition
    )


@pytest.mark.parametrize(("bits", "at_least"), [(4, 12), (8, 100)])
def test_entropy_spreads_partitions(bits: int, at_least: int) -> None:
    layout = ObjectKeyLayout(entropy_bits=bits, cluster="c1")
    values = {layout.entropy(f"topic-{t}", p) for t in range(16) for p in range(16)}
    assert at_least <= len(values) <= 2**bits
    assert all(int(v[:-1], 16) < 2**bits for v in values)


def test_different_clusters_get_different_keys_and_entropy() -> None:
    a = ObjectKeyLayout(entropy_bits=8, cluster="east")
    b = ObjectKeyLayout(entropy_bits=8, cluster="west")
    m = metadata()
    assert a.segment_key(m, LOG_SUFFIX) != b.segment_key(m, LOG_SUFFIX)
    assert "/east/orders-" in a.segment_key(m, LOG_SUFFIX)
    assert "/west/orders-" in b.segment_key(m, LOG_SUFFIX)
    differing = [p for p in range(32) if a.entropy("orders", p) != b.entropy("orders", p)]
    assert len(differing) > 16  # the cluster is part of the hash


@pytest.mark.parametrize("bits", [-1, 33])
def test_entropy_bits_out_of_range_are_rejected(bits: int) -> None:
    with pytest.raises(ValueError, match="entropy bits"):
        ObjectKeyLayout(entropy_bits=bits)


def test_all_keys_log_and_indexes_first_then_the_manifest_last() -> None:
    layout = ObjectKeyLayout(entropy_bits=4, cluster="c1")
    m = metadata()
    assert layout.all_keys(m) == [
        layout.segment_key(m, LOG_SUFFIX),
        layout.segment_key(m, INDEXES_SUFFIX),
        layout.segment_key(m, MANIFEST_SUFFIX),
    ]


def test_manifest_json_holds_the_metadata_and_every_object() -> None:
    layout = ObjectKeyLayout(prefix="t/", entropy_bits=4, cluster="c1")
    m = metadata()
    entries = {
        LOG_SUFFIX: {"size": 4096, "crc32c": 7, "chunk_size": 4096, "chunks": [4096]},
        INDEXES_SUFFIX: {"size": 240, "crc32c": 9},
    }
    raw = manifest_json(m, layout, entries)
    document = json.loads(raw)
    assert document["version"] == MANIFEST_VERSION == 3
    assert RemoteLogSegmentMetadata.from_json(document["segment"]) == m
    assert document["segment"]["segment_leader_epochs"] == [[0, 0], [3, 1200]]
    assert document["objects"] == {
        suffix: {"key": layout.segment_key(m, suffix), **entry} for suffix, entry in entries.items()
    }
    assert MANIFEST_SUFFIX not in document["objects"]  # it does not list itself
    # Deterministic bytes (sorted keys), whatever the order entries were given in.
    assert manifest_json(m, layout, dict(reversed(entries.items()))) == raw
