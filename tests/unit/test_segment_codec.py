"""Segments stored in compressed and encrypted chunks: round trips, ranges, keys, tampering."""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

import pytest

from tierbroker.protocol.records import Compression, build_batch
from tierbroker.storage.remote.segment_codec import (
    KeyRing,
    ObjectEncoder,
    ObjectKind,
    SegmentDecodeError,
    SegmentTransform,
    StoredFormat,
    TransformConfig,
    compressible,
    decode_indexes,
    decode_range,
    encode_indexes,
)

SEGMENT = uuid.uuid4()
CHUNK = 4096


def ring(*ids: str, active: str | None = None) -> KeyRing:
    return KeyRing({i: bytes([n]) * 32 for n, i in enumerate(ids, 1)}, active)


def stored(tmp_path: Path, plain: bytes, transform: SegmentTransform | None) -> tuple[bytes, dict]:
    path = tmp_path / "segment.log"
    path.write_bytes(plain)
    fd = os.open(path, os.O_RDONLY)
    try:
        encoder = ObjectEncoder(fd, len(plain), transform, CHUNK)
        pieces = []
        while not encoder.done:
            pieces.append(encoder.read(3 * CHUNK))
        return b"".join(pieces), encoder.entry()
    finally:
        os.close(fd)


def read_range(
    data: bytes, entry: dict, transform: SegmentTransform, start: int, end: int
) -> bytes:
    fmt = StoredFormat.from_json(entry)
    s, e = fmt.stored_range(start, end)
    return decode_range(transform, fmt, start, end, data[s:e])


@pytest.mark.parametrize(
    ("compress", "encrypt"), [(True, False), (False, True), (True, True)], ids=str
)
def test_any_range_reads_back_through_the_chunks_holding_it(
    tmp_path: Path, compress: bool, encrypt: bool
) -> None:
    plain = (b"abc" * 5000) + os.urandom(9000) + b"\x00" * 7000
    config = TransformConfig(
        chunk_bytes=CHUNK, compression=compress, keys=ring("k1", active="k1" if encrypt else None)
    )
    transform = SegmentTransform.for_upload(SEGMENT, config, compressible=True)
    assert transform is not None
    data, entry = stored(tmp_path, plain, transform)
    assert entry["size"] == len(data) and len(entry["chunks"]) == -(-len(plain) // CHUNK)
    assert ("compression" in entry) == compress and ("encryption" in entry) == encrypt
    reader = SegmentTransform.for_read(SEGMENT, StoredFormat.from_json(entry), config.keys)
    for start, end in [
        (0, len(plain)),
        (0, 1),
        (CHUNK - 1, CHUNK + 1),
        (5000, 20000),
        (20999, 31000),
    ]:
        assert read_range(data, entry, reader, start, end) == plain[start:end], (start, end)
    if compress:
        assert len(data) < len(plain)


def test_a_plain_object_is_stored_as_written_with_its_crc(tmp_path: Path) -> None:
    plain = os.urandom(10_000)
    data, entry = stored(tmp_path, plain, None)
    assert data == plain
    assert StoredFormat.from_json(entry).plain and set(entry) == {"size", "crc32c"}


def test_a_changed_byte_or_a_moved_chunk_fails_never_returns_other_bytes(tmp_path: Path) -> None:
    keys = ring("k1", active="k1")
    transform = SegmentTransform.for_upload(
        SEGMENT, TransformConfig(chunk_bytes=CHUNK, keys=keys), False
    )
    assert transform is not None
    data, entry = stored(tmp_path, os.urandom(3 * CHUNK), transform)
    fmt = StoredFormat.from_json(entry)
    changed = bytearray(data)
    changed[10] ^= 1
    with pytest.raises(SegmentDecodeError, match="chunk 0 of its log does not decrypt"):
        read_range(bytes(changed), entry, transform, 0, 10)
    first = data[: fmt.chunk_sizes[0]]
    with pytest.raises(SegmentDecodeError, match="chunk 1"):
        transform.decode(ObjectKind.LOG, 1, first)  # chunk 0's bytes where chunk 1 should be
    with pytest.raises(SegmentDecodeError):
        SegmentTransform.for_read(uuid.uuid4(), fmt, keys)  # another segment's data key
    indexes, _ = encode_indexes(transform, b"the indexes")
    with pytest.raises(SegmentDecodeError):
        transform.decode(ObjectKind.LOG, 0, indexes)
    assert decode_indexes(transform, indexes) == b"the indexes"


def test_rotation_reads_old_segments_with_the_key_they_name() -> None:
    old = SegmentTransform.for_upload(
        SEGMENT, TransformConfig(chunk_bytes=CHUNK, keys=ring("k1", active="k1")), False
    )
    assert old is not None and old.wrapped is not None and old.wrapped.key_id == "k1"
    stored_chunk = old.encode(ObjectKind.LOG, 0, b"records")
    fmt = old.format(CHUNK, [len(stored_chunk)])
    rotated = ring("k1", "k2", active="k2")
    assert (
        SegmentTransform.for_read(SEGMENT, fmt, rotated).decode(ObjectKind.LOG, 0, stored_chunk)
        == b"records"
    )
    with pytest.raises(
        SegmentDecodeError, match="encrypted with key 'k1', which is not configured"
    ):
        SegmentTransform.for_read(SEGMENT, fmt, ring("k2"))
    impostor = KeyRing({"k1": b"\x09" * 32})
    with pytest.raises(SegmentDecodeError, match="key 'k1' does not open its data key"):
        SegmentTransform.for_read(SEGMENT, fmt, impostor)


def test_keys_come_from_files_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, text = os.urandom(32), os.urandom(32)
    (tmp_path / "raw.key").write_bytes(raw)
    (tmp_path / "text.key").write_text(base64.b64encode(text).decode() + "\n")
    monkeypatch.setenv("TIER_KEY", base64.b64encode(b"\x07" * 32).decode())
    keys = KeyRing.from_configs(
        {
            "encryption.keys": "raw, Text ,env",
            "encryption.keys.raw.file": str(tmp_path / "raw.key"),
            "encryption.keys.text.file": str(tmp_path / "text.key"),
            "encryption.keys.env.env": "TIER_KEY",
            "encryption.enabled": "true",
            "encryption.key.id": "ENV",
        }
    )
    assert keys.keys == {"raw": raw, "text": text, "env": b"\x07" * 32}
    assert keys.active == "env"
    readers = KeyRing.from_configs(
        {"encryption.keys": "raw", "encryption.keys.raw.file": str(tmp_path / "raw.key")}
    )
    assert readers.active is None  # keys to read with, encryption off


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({"encryption.keys": "a"}, "set one of encryption.keys.a.file and encryption.keys.a.env"),
        (
            {"encryption.keys": "a", "encryption.keys.a.env": "NOT_SET_ANYWHERE"},
            "the environment has no variable NOT_SET_ANYWHERE",
        ),
        ({"encryption.keys": "a", "encryption.keys.a.file": "/nonexistent/key"}, "cannot read"),
        ({"encryption.enabled": "true"}, "encryption.enabled=true needs encryption.key.id"),
        ({"encryption.enabled": "yes"}, "encryption.enabled must be true or false"),
        ({"compression.enabled": "1"}, "compression.enabled must be true or false"),
    ],
)
def test_bad_settings_say_what_to_fix(configs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TransformConfig.from_configs(configs)


def test_a_short_key_and_an_unknown_active_id_are_refused(tmp_path: Path) -> None:
    (tmp_path / "short.key").write_bytes(b"too short")
    with pytest.raises(ValueError, match="not 32 bytes, nor their base64"):
        KeyRing.from_configs(
            {"encryption.keys": "s", "encryption.keys.s.file": str(tmp_path / "short.key")}
        )
    with pytest.raises(ValueError, match=r"encryption\.key\.id=b: not one of"):
        KeyRing({"a": b"\x01" * 32}, "b")


def test_only_logs_of_mostly_uncompressed_batches_are_compressed(tmp_path: Path) -> None:
    records = [(b"k", b"v" * 1000, [], 0)] * 20

    def log_of(compression: Compression) -> bool:
        path = tmp_path / f"{compression.name}.log"
        batches = b"".join(
            bytes(build_batch(records, compression=compression, base_offset=i * 20))
            for i in range(5)
        )
        path.write_bytes(batches)
        fd = os.open(path, os.O_RDONLY)
        try:
            return compressible(fd, len(batches))
        finally:
            os.close(fd)

    assert log_of(Compression.NONE)
    assert not log_of(Compression.ZSTD)
