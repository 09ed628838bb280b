"""How a segment's objects are stored: as written, or in chunks each compressed (zstd) and
encrypted (AES-256-GCM) on its own, so that a ranged read decodes only the chunks it needs.

A transformed log object is the plain log cut in chunks of `chunk.size` bytes, each stored
as its zstd frame (if compressed), then that encrypted with its 16-byte tag appended (if
encrypted), back to back. The manifest's entry for the object (`StoredFormat`) names the
transform and lists every stored chunk's size, so plain bytes [a, b) are one ranged read
of the chunks holding them. The indexes object is one chunk. Every entry also carries the
CRC32C of the object as stored, for scrubbing. A plain object is stored as written.

Encryption: each segment has its own random 256-bit data key, kept in the manifest
wrapped by a key-encryption key (AES-256-GCM as well) named by id. `encryption.key.id`
names the key that wraps new segments' data keys; every key of `encryption.keys` unwraps,
so a key is rotated by adding a new one and making it active, and old segments are read
with the key they name, never uploaded again. Chunk i's nonce is the object's kind and i
(a data key encrypts one segment only, so no nonce repeats under it); its associated data
is the segment id, the kind and i, so no chunk can stand in for another. A missing or
wrong key, or a changed byte, fails the read with `SegmentDecodeError`; it never returns
other bytes.

Compression (`compression.enabled`) applies to segments whose batches are mostly
uncompressed: their headers say so, and a producer's compression already did the work
otherwise.

A copy returns `stored_tag` as its custom metadata (KIP-917), kept with the segment's
remote metadata: a read of a segment tagged as stored as written needs no manifest.
"""

from __future__ import annotations

import base64
import enum
import os
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cramjam
import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tierbroker.protocol.records import BATCH_HEADER_SIZE, BatchView, Compression
from tierbroker.storage.remote.chunk_cache import DEFAULT_CHUNK_BYTES, config_int

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
ALGORITHM = "AES-256-GCM"
ZSTD = "zstd"
ZSTD_LEVEL = 3
# A segment is compressed if at least this share of its bytes is in uncompressed batches.
COMPRESSIBLE_SHARE = 0.5
SAMPLED_BATCHES = 1024
_WRAP_CONTEXT = b"tierbroker data key"


AS_WRITTEN_TAG = b"\x00"
CHUNKED_TAG = b"\x01"


def stored_tag(transform: SegmentTransform | None) -> bytes:
    """The custom metadata of a segment copied with `transform` (None: as written)."""
    return AS_WRITTEN_TAG if transform is None else CHUNKED_TAG


class ObjectKind(enum.IntEnum):
    """Which object of a segment a chunk belongs to: part of its nonce and associated data."""

    LOG = 0
    INDEXES = 1


class SegmentDecodeError(Exception):
    """A stored segment cannot be decoded: its key is missing or wrong, or its bytes changed."""


# Keys -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A segment's data key as its manifest keeps it: wrapped by key `key_id`."""

    key_id: str
    wrapped: bytes  # nonce, then the data key encrypted, then the tag

    def to_json(self) -> dict[str, str]:
        return {
            "algorithm": ALGORITHM,
            "key_id": self.key_id,
            "data_key": base64.b64encode(self.wrapped).decode(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> WrappedKey:
        if data.get("algorithm") != ALGORITHM:
            raise SegmentDecodeError(f"unknown encryption {data.get('algorithm')!r}")
        return cls(data["key_id"], base64.b64decode(data["data_key"]))


class KeyRing:
    """Key-encryption keys by id; `active` (None: encryption off) wraps new data keys."""

    def __init__(self, keys: Mapping[str, bytes], active: str | None = None) -> None:
        for key_id, key in keys.items():
            if len(key) != KEY_BYTES:
                raise ValueError(f"encryption key {key_id!r}: {len(key)} bytes, not {KEY_BYTES}")
        # Ids are matched ignoring case: Spark lowercases the options that name them.
        self.keys = {key_id.lower(): key for key_id, key in keys.items()}
        self.active = None if active is None else active.lower()
        if self.active is not None and self.active not in self.keys:
            raise ValueError(f"encryption.key.id={active}: not one of encryption.keys")

    @classmethod
    def from_configs(cls, configs: Mapping[str, str]) -> KeyRing:
        """`encryption.keys` (ids), each `encryption.keys.<id>.file` (32 bytes, or their
        base64) or `.env` (an environment variable holding their base64), and, to encrypt,
        `encryption.enabled=true` with `encryption.key.id`. ValueError names what is wrong."""
        configs = {name.lower(): value for name, value in configs.items()}
        ids = [
            i.strip().lower() for i in configs.get("encryption.keys", "").split(",") if i.strip()
        ]
        keys = {key_id: _load_key(configs, key_id) for key_id in ids}
        enabled = configs.get("encryption.enabled", "false").strip().lower()
        if enabled not in ("true", "false"):
            raise ValueError(f"encryption.enabled must be true or false, not {enabled!r}")
        active = configs.get("encryption.key.id") or None
        if enabled == "true" and active is None:
            raise ValueError("encryption.enabled=true needs encryption.key.id")
        return cls(keys, active if enabled == "true" else None)

    def new_data_key(self, segment_id: uuid.UUID) -> tuple[bytes, WrappedKey]:
        """A fresh data key for a segment, and its wrapping by the active key."""
        assert self.active is not None
        data_key = AESGCM.generate_key(bit_length=256)
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self.keys[self.active]).encrypt(
            nonce, data_key, _WRAP_CONTEXT + segment_id.bytes
        )
        return data_key, WrappedKey(self.active, nonce + sealed)

    def data_key(self, wrapped: WrappedKey, segment_id: uuid.UUID) -> bytes:
        """The segment's data key; SegmentDecodeError if its key is not here or is not it."""
        kek = self.keys.get(wrapped.key_id.lower())
        if kek is None:
            raise SegmentDecodeError(
                f"segment {segment_id} is encrypted with key {wrapped.key_id!r}, which is not "
                f"configured (encryption.keys, encryption.keys.{wrapped.key_id}.file or .env)"
            )
        nonce, sealed = wrapped.wrapped[:NONCE_BYTES], wrapped.wrapped[NONCE_BYTES:]
        try:
            return AESGCM(kek).decrypt(nonce, sealed, _WRAP_CONTEXT + segment_id.bytes)
        except InvalidTag:
            raise SegmentDecodeError(
                f"segment {segment_id}: key {wrapped.key_id!r} does not open its data key "
                "(a different key under the same id?)"
            ) from None


def _load_key(configs: Mapping[str, str], key_id: str) -> bytes:
    name = f"encryption.keys.{key_id}"
    file, env = configs.get(f"{name}.file"), configs.get(f"{name}.env")
    if (file is None) == (env is None):
        raise ValueError(f"encryption key {key_id!r}: set one of {name}.file and {name}.env")
    if file is not None:
        try:
            raw = Path(file).read_bytes()
        except OSError as e:
            raise ValueError(f"{name}.file: cannot read {file}: {e.strerror}") from None
        if len(raw) == KEY_BYTES:
            return raw
        text, where = raw.decode(errors="replace").strip(), f"{name}.file ({file})"
    else:
        assert env is not None
        if env not in os.environ:
            raise ValueError(f"{name}.env: the environment has no variable {env}")
        text, where = os.environ[env].strip(), f"{name}.env ({env})"
    try:
        key = base64.b64decode(text, validate=True)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError(f"{where}: not {KEY_BYTES} bytes, nor their base64")
    return key


# Formats -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredFormat:
    """How one object is stored, as its manifest entry says (beside its key and size)."""

    chunk_bytes: int = 0  # the plain chunk size; 0: stored as written
    chunk_sizes: tuple[int, ...] = ()  # stored, in order
    compression: str | None = None
    encryption: WrappedKey | None = None
    _starts: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        starts, at = [], 0
        for size in self.chunk_sizes:
            starts.append(at)
            at += size
        starts.append(at)
        object.__setattr__(self, "_starts", tuple(starts))

    @property
    def plain(self) -> bool:
        return self.chunk_bytes == 0

    def stored_range(self, start: int, end: int) -> tuple[int, int]:
        """Bytes [a, b) of the stored object holding the chunks of plain bytes [start, end)."""
        first = start // self.chunk_bytes
        last = min((end - 1) // self.chunk_bytes, len(self.chunk_sizes) - 1)
        return self._starts[first], self._starts[last + 1]

    def to_json(self) -> dict[str, Any]:
        if self.plain:
            return {}
        document: dict[str, Any] = {"chunk_size": self.chunk_bytes, "chunks": self.chunk_sizes}
        if self.compression is not None:
            document["compression"] = self.compression
        if self.encryption is not None:
            document["encryption"] = self.encryption.to_json()
        return document

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> StoredFormat:
        """The format of a manifest entry (one without transform fields is plain)."""
        if "chunk_size" not in entry:
            return cls()
        compression = entry.get("compression")
        if compression not in (None, ZSTD):
            raise SegmentDecodeError(f"unknown compression {compression!r}")
        encryption = entry.get("encryption")
        return cls(
            chunk_bytes=int(entry["chunk_size"]),
            chunk_sizes=tuple(int(s) for s in entry["chunks"]),
            compression=compression,
            encryption=None if encryption is None else WrappedKey.from_json(encryption),
        )


PLAIN = StoredFormat()


@dataclass(frozen=True, slots=True, kw_only=True)
class TransformConfig:
    """What new segments are stored as (`rsm.config.` properties, or a reader's options)."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # chunk.size, as the chunk cache reads
    compression: bool = False  # compression.enabled
    keys: KeyRing = field(default_factory=lambda: KeyRing({}))

    @classmethod
    def from_configs(cls, configs: Mapping[str, str]) -> TransformConfig:
        compression = configs.get("compression.enabled", "false").strip().lower()
        if compression not in ("true", "false"):
            raise ValueError(f"compression.enabled must be true or false, not {compression!r}")
        return cls(
            chunk_bytes=config_int(configs, "chunk.size", DEFAULT_CHUNK_BYTES, 4096),
            compression=compression == "true",
            keys=KeyRing.from_configs(configs),
        )


class SegmentTransform:
    """The transform of one segment's objects, its data key unwrapped once."""

    def __init__(
        self,
        segment_id: uuid.UUID,
        compression: str | None,
        data_key: bytes | None,
        wrapped: WrappedKey | None,
    ) -> None:
        self.segment_id = segment_id
        self.compression = compression
        self.wrapped = wrapped
        self._cipher = None if data_key is None else AESGCM(data_key)

    @classmethod
    def for_upload(
        cls, segment_id: uuid.UUID, config: TransformConfig, compressible: bool
    ) -> SegmentTransform | None:
        """The transform of a new segment, None if it is stored as written."""
        compression = ZSTD if config.compression and compressible else None
        if config.keys.active is None:
            return None if compression is None else cls(segment_id, compression, None, None)
        data_key, wrapped = config.keys.new_data_key(segment_id)
        return cls(segment_id, compression, data_key, wrapped)

    @classmethod
    def for_read(
        cls, segment_id: uuid.UUID, stored: StoredFormat, keys: KeyRing
    ) -> SegmentTransform:
        wrapped = stored.encryption
        data_key = None if wrapped is None else keys.data_key(wrapped, segment_id)
        return cls(segment_id, stored.compression, data_key, wrapped)

    def format(self, chunk_bytes: int, chunk_sizes: list[int]) -> StoredFormat:
        return StoredFormat(
            chunk_bytes=chunk_bytes,
            chunk_sizes=tuple(chunk_sizes),
            compression=self.compression,
            encryption=self.wrapped,
        )

    def _nonce_and_aad(self, kind: ObjectKind, index: int) -> tuple[bytes, bytes]:
        nonce = struct.pack(">IQ", kind, index)
        return nonce, self.segment_id.bytes + nonce

    def encode(self, kind: ObjectKind, index: int, plain: bytes | memoryview) -> bytes:
        data = (
            bytes(plain) if self.compression is None else cramjam.zstd.compress(plain, ZSTD_LEVEL)
        )
        if self._cipher is None:
            return bytes(data)
        nonce, aad = self._nonce_and_aad(kind, index)
        return self._cipher.encrypt(nonce, bytes(data), aad)

    def decode(self, kind: ObjectKind, index: int, stored: bytes | memoryview) -> bytes:
        data = stored
        if self.wrapped is not None:
            if self._cipher is None:
                raise SegmentDecodeError(f"segment {self.segment_id}: its data key is not open")
            nonce, aad = self._nonce_and_aad(kind, index)
            try:
                data = self._cipher.decrypt(nonce, bytes(data), aad)
            except InvalidTag:
                raise SegmentDecodeError(
                    f"segment {self.segment_id}: chunk {index} of its {kind.name.lower()} "
                    "does not decrypt (changed in the store?)"
                ) from None
        if self.compression is not None:
            try:
                return bytes(cramjam.zstd.decompress(data))
            except cramjam.DecompressionError as e:
                raise SegmentDecodeError(
                    f"segment {self.segment_id}: chunk {index} does not decompress: {e}"
                ) from None
        return bytes(data)

    def decode_chunks(self, stored: StoredFormat, first: int, data: bytes | memoryview) -> bytes:
        """The plain bytes of the log's chunks first.. (`data`: their stored bytes)."""
        view, at, pieces = memoryview(data), 0, []
        for index in range(first, len(stored.chunk_sizes)):
            if at >= len(view):
                break
            size = stored.chunk_sizes[index]
            pieces.append(self.decode(ObjectKind.LOG, index, view[at : at + size]))
            at += size
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def decode_range(
    transform: SegmentTransform, stored: StoredFormat, start: int, end: int, data: bytes
) -> bytes:
    """Plain bytes [start, end) of a log, from the stored bytes of the chunks holding them
    (`stored.stored_range(start, end)`)."""
    first = start // stored.chunk_bytes
    plain = transform.decode_chunks(stored, first, data)
    offset = first * stored.chunk_bytes
    return plain[start - offset : end - offset]


# Encoding -----------------------------------------------------------------------------------


class ObjectEncoder:
    """A file's bytes as they are stored, read in order (blocking: run it off the event loop);
    the CRC32C of what was read and, if transformed, each stored chunk's size."""

    def __init__(
        self,
        fd: int,
        size: int,
        transform: SegmentTransform | None,
        chunk_bytes: int,
    ) -> None:
        self.fd = fd
        self.size = size
        self.transform = transform
        self.chunk_bytes = chunk_bytes
        self.position = 0  # in the file
        self.stored_bytes = 0
        self.crc32c = 0
        self.chunk_sizes: list[int] = []

    @property
    def done(self) -> bool:
        return self.position >= self.size

    def read(self, at_least: int) -> bytes:
        """The next stored bytes: `at_least` of them (whole chunks if transformed), fewer
        only at the end; b"" after it."""
        if self.transform is None:
            data = _pread_exactly(self.fd, min(at_least, self.size - self.position), self.position)
            self.position += len(data)
        else:
            pieces, length = [], 0
            while length < at_least and not self.done:
                plain = _pread_exactly(
                    self.fd, min(self.chunk_bytes, self.size - self.position), self.position
                )
                stored = self.transform.encode(ObjectKind.LOG, len(self.chunk_sizes), plain)
                self.position += len(plain)
                self.chunk_sizes.append(len(stored))
                pieces.append(stored)
                length += len(stored)
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self.stored_bytes += len(data)
        self.crc32c = crc32c.crc32c(data, self.crc32c)
        return data

    def entry(self) -> dict[str, Any]:
        """The manifest entry of what was read (without its key)."""
        entry: dict[str, Any] = {"size": self.stored_bytes, "crc32c": self.crc32c}
        if self.transform is not None:
            entry |= self.transform.format(self.chunk_bytes, self.chunk_sizes).to_json()
        return entry


def encode_indexes(
    transform: SegmentTransform | None, bundle: bytes
) -> tuple[bytes, dict[str, Any]]:
    """The indexes object as stored, and its manifest entry (without its key)."""
    if transform is None:
        return bundle, {"size": len(bundle), "crc32c": crc32c.crc32c(bundle)}
    stored = transform.encode(ObjectKind.INDEXES, 0, bundle)
    entry = {"size": len(stored), "crc32c": crc32c.crc32c(stored)}
    return stored, entry | transform.format(len(bundle) or 1, [len(stored)]).to_json()


def decode_indexes(transform: SegmentTransform | None, stored: bytes) -> bytes:
    return stored if transform is None else transform.decode(ObjectKind.INDEXES, 0, stored)


def compressible(fd: int, size: int) -> bool:
    """Whether most of a log's first batches (up to `SAMPLED_BATCHES`) are without record
    compression; their headers only are read (blocking)."""
    uncompressed, position = 0, 0
    for _ in range(SAMPLED_BATCHES):
        if position + BATCH_HEADER_SIZE > size:
            break
        batch = BatchView(os.pread(fd, BATCH_HEADER_SIZE, position))
        if batch.size_in_bytes < BATCH_HEADER_SIZE:
            break  # a torn tail
        if batch.compression is Compression.NONE:
            uncompressed += batch.size_in_bytes
        position += batch.size_in_bytes
    return position > 0 and uncompressed >= COMPRESSIBLE_SHARE * position


def _pread_exactly(fd: int, length: int, position: int) -> bytes:
    data = os.pread(fd, length, position)
    while len(data) < length:  # a short read: rare, but allowed
        more = os.pread(fd, length - len(data), position + len(data))
        if not more:
            raise OSError(f"file ended at {position + len(data)}, expected {position + length}")
        data += more
    return data
