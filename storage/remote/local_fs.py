"""`LocalFsRemoteStorageManager`: the remote tier in a local directory (the embedded default).

Objects are files under `rsm.config.dir`, named by `ObjectKeyLayout`. Each is
written to a temporary name, fsynced and renamed, the manifest last, so a crash
never leaves a half-written object under its final name. A segment's data is
written around the page cache (O_DIRECT): what is tiered is cold, and a copy
through the page cache would fill pages no one reads and evict the tail that
consumers do. File work runs in the default executor, never on the event loop.
`check()` creates the directory if it is missing and writes a file in it.

Its `meter` counts the file operations as the requests an object store would see for
them: an object written (log, indexes, manifest) is a PUT and its bytes an upload, a
read a GET and a download, each object removed a DELETE.
"""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import crc32c

from tierbroker.storage.remote.index_bundle import index_from_bundle, read_index_bundle
from tierbroker.storage.remote.key_layout import (
    INDEXES_SUFFIX,
    LOG_SUFFIX,
    MANIFEST_SUFFIX,
    ObjectKeyLayout,
    manifest_json,
)
from tierbroker.storage.remote.manifest_cache import (
    ManifestCache,
    StoredSegment,
    manifest_cache_size,
)
from tierbroker.storage.remote.request_meter import RequestKind, Transfer
from tierbroker.storage.remote.segment_codec import (
    ObjectEncoder,
    SegmentTransform,
    StoredFormat,
    TransformConfig,
    compressible,
    decode_indexes,
    encode_indexes,
    stored_tag,
)
from tierbroker.storage.remote.segment_metadata import RemoteLogSegmentMetadata, TopicIdPartition
from tierbroker.storage.remote.storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
)

T = TypeVar("T")

COPY_CHUNK = 1 << 20
DIRECT_ALIGNMENT = 4096  # the largest logical block size of common devices


class LocalFsRemoteStorageManager(RemoteStorageManager):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path("remote")
        self.layout = ObjectKeyLayout()
        self.transforms = TransformConfig()
        self.manifests = ManifestCache(self.transforms.keys, self._read_manifest)

    def configure(self, configs: Mapping[str, str]) -> None:
        self.root = Path(configs["dir"])
        self.layout = ObjectKeyLayout(
            prefix=configs.get("key.prefix", ""),
            entropy_bits=int(configs.get("key.prefix.entropy.bits", "0")),
            cluster=configs.get("cluster.id", "cluster"),
        )
        self.transforms = TransformConfig.from_configs(configs)
        self.manifests = ManifestCache(
            self.transforms.keys, self._read_manifest, manifest_cache_size(configs)
        )

    @staticmethod
    async def _run(fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def check(self, timeout_s: float) -> bool:
        """The directory exists (it is created if missing) and a file can be written in it."""
        try:
            await self._run(self._check)
        except OSError as e:
            raise RemoteStorageError(
                f"remote dir {self.root} is not writable ({e}): fix rsm.config.dir "
                "or the directory's permissions",
                retriable=False,
            ) from e
        return True

    def _check(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        probe = self.root / f".check-{uuid.uuid4().hex}.tmp"
        try:
            with open(probe, "xb") as f:
                f.write(b"check")
                os.fsync(f.fileno())
        finally:
            probe.unlink(missing_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / key

    # Copy ----------------------------------------------------------------------------

    async def copy_log_segment_data(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> bytes:
        try:
            stored = await self._run(self._copy, metadata, data)
        except OSError:
            await self.delete_log_segment_data(metadata)
            raise
        self.manifests.put(metadata.segment_id.id, stored)
        return stored_tag(stored.transform)

    def _copy(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> StoredSegment:
        topic = _topic(metadata)
        log_key = self.layout.segment_key(metadata, LOG_SUFFIX)
        fd = os.open(data.log_segment, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            transform = SegmentTransform.for_upload(
                metadata.segment_id.id,
                self.transforms,
                self.transforms.compression and compressible(fd, size),
            )
            if transform is None:
                log_entry = self._put(topic, self._copy_file, fd, log_key)
            else:
                encoder = ObjectEncoder(fd, size, transform, self.transforms.chunk_bytes)
                log_entry = self._put(topic, self._write_encoded, encoder, log_key)
        finally:
            os.close(fd)
        indexes, indexes_entry = encode_indexes(transform, read_index_bundle(data))
        self._put(topic, self._write, self.layout.segment_key(metadata, INDEXES_SUFFIX), indexes)
        entries = {LOG_SUFFIX: log_entry, INDEXES_SUFFIX: indexes_entry}
        manifest = manifest_json(metadata, self.layout, entries)
        self._put(topic, self._write, self.layout.segment_key(metadata, MANIFEST_SUFFIX), manifest)
        return StoredSegment(StoredFormat.from_json(log_entry), transform)

    def _put(self, topic: str, write: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """One object written by `write(*args)` (which returns its manifest entry), counted
        as a PUT."""
        self.meter.request(topic, RequestKind.PUT)
        entry = write(*args)
        self.meter.transferred(topic, Transfer.UPLOAD, entry["size"])
        return entry

    def _copy_file(self, source: int, key: str) -> dict[str, Any]:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        size, crc = copy_around_page_cache(source, tmp)
        self._sync_and_rename(tmp, target)
        return {"size": size, "crc32c": crc}

    def _write_encoded(self, encoder: ObjectEncoder, key: str) -> dict[str, Any]:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as f:
            while not encoder.done:
                f.write(encoder.read(COPY_CHUNK))
        self._sync_and_rename(tmp, target)
        return encoder.entry()

    def _write(self, key: str, data: bytes) -> dict[str, Any]:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        self._sync_and_rename(tmp, target)
        return {"size": len(data)}

    @staticmethod
    def _sync_and_rename(tmp: Path, target: Path) -> None:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)

    # Reads ---------------------------------------------------------------------------

    async def fetch_log_segment(
        self,
        metadata: RemoteLogSegmentMetadata,
        start_position: int,
        end_position: int | None = None,
    ) -> bytes:
        key = self.layout.segment_key(metadata, LOG_SUFFIX)
        topic = _topic(metadata)
        stored = await self.manifests.get(metadata)
        if stored.transform is None:
            return await self._run(self._read, topic, key, start_position, end_position)

        async def get(start: int, end: int) -> bytes:
            return await self._run(self._read, topic, key, start, end - 1)

        size = metadata.segment_size_bytes
        return await stored.read_chunked(size, start_position, end_position, get, None)

    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        key = self.layout.segment_key(metadata, INDEXES_SUFFIX)
        stored = await self.manifests.get(metadata)
        bundle = await self._run(self._read, _topic(metadata), key, 0, None)
        bundle = await self._run(decode_indexes, stored.transform, bundle)
        return index_from_bundle(key, bundle, index_type)

    async def _read_manifest(self, metadata: RemoteLogSegmentMetadata) -> bytes:
        key = self.layout.segment_key(metadata, MANIFEST_SUFFIX)
        return await self._run(self._read, _topic(metadata), key, 0, None)

    def _read(self, topic: str, key: str, start: int, end: int | None) -> bytes:
        self.meter.request(topic, RequestKind.GET)
        try:
            with open(self._path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                stop = size if end is None else min(end + 1, size)
                data = os.pread(f.fileno(), max(stop - start, 0), start)
        except FileNotFoundError:
            raise RemoteResourceNotFoundError(f"no remote object {key}") from None
        self.meter.transferred(topic, Transfer.DOWNLOAD, len(data))
        return data

    # Delete --------------------------------------------------------------------------

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        self.manifests.remove(metadata.segment_id.id)
        await self._run(self._delete, metadata)

    def _delete(self, metadata: RemoteLogSegmentMetadata) -> None:
        # The manifest goes first, so readers stop trusting the segment before its data goes.
        for key in reversed(self.layout.all_keys(metadata)):
            self.meter.request(_topic(metadata), RequestKind.DELETE)
            for path in (self._path(key), self._path(key + ".tmp")):
                path.unlink(missing_ok=True)

    # Partition index ------------------------------------------------------------------

    async def write_partition_index(self, tip: TopicIdPartition, document: bytes) -> bool:
        """A temporary file, fsynced and renamed over the index: one PUT."""
        key = self.layout.partition_index_key(tip)
        await self._run(self._put, tip.topic_partition.topic, self._write, key, document)
        return True

    async def delete_partition_index(self, tip: TopicIdPartition) -> None:
        await self._run(self._delete_index, tip)

    def _delete_index(self, tip: TopicIdPartition) -> None:
        self.meter.request(tip.topic_partition.topic, RequestKind.DELETE)
        self._path(self.layout.partition_index_key(tip)).unlink(missing_ok=True)


def _topic(metadata: RemoteLogSegmentMetadata) -> str:
    return metadata.topic_id_partition.topic_partition.topic


def copy_around_page_cache(src: int, target: Path) -> tuple[int, int]:
    """Copy file `src` from its start to a new file `target` with O_DIRECT writes; its size
    in bytes and CRC32C.

    Where the file system refuses O_DIRECT, the same writes go through the page cache.
    """
    view = memoryview(mmap.mmap(-1, COPY_CHUNK))  # page-aligned, as O_DIRECT needs
    os.lseek(src, 0, os.SEEK_SET)
    dst = _open_direct(target)
    try:
        size, crc = 0, 0
        while got := _fill(src, view):
            # Every write is whole blocks from a block-aligned offset; the last one's
            # padding is cut off below.
            length = -(-got // DIRECT_ALIGNMENT) * DIRECT_ALIGNMENT
            if os.write(dst, view[:length]) != length:
                raise OSError(errno.EIO, f"short write to {target}")
            size += got
            crc = crc32c.crc32c(view[:got], crc)
            if got < COPY_CHUNK:
                break
        os.ftruncate(dst, size)
        return size, crc
    finally:
        os.close(dst)


def _open_direct(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        return os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.open(path, flags, 0o644)


def _fill(fd: int, view: memoryview) -> int:
    """Read into `view` until it is full or the file ends; the bytes read."""
    got = 0
    while got < len(view) and (n := os.readv(fd, [view[got:]])):
        got += n
    return got
