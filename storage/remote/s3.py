"""`S3RemoteStorageManager`: the remote tier in an S3 bucket (AWS, MinIO, or any S3 endpoint).

Objects are named by `ObjectKeyLayout` (see there): per segment `<base>.log`,
`<base>.indexes` (every index, see `index_bundle`) and `<base>.manifest.json`,
the commit marker.

Copy: the log goes up with PutObject up to `storage.s3.multipart.upload.part.size`
and with a multipart upload above it, read a part at a time in the default
executor (at most one part in memory) and hashed there for its signature
(`s3_payload`), concurrently with the indexes; then the manifest, last. An index
is fetched by getting the segment's indexes object; the GET is shared by
concurrent fetches and its answer kept for the last few segments, since indexes
are asked for one type at a time.
If anything fails, unfinished multipart uploads are aborted and every object of
the segment is deleted (no orphans) before `RemoteStorageError` is raised; a
cancelled copy does the same clean-up in the background. Reads are (ranged) GETs
made by botocore's synchronous client in the plugin's reader threads, which receive
a body into one buffer with the GIL released; aiohttp would hand it to the event
loop in 256 KiB callbacks, copy each and join them, which cost the broker about 40%
more CPU per remote read of 8 MiB. A missing object raises
`RemoteResourceNotFoundError`. Delete removes the manifest first, so readers stop
trusting the segment, then the rest in one DeleteObjects; missing objects are not
errors.

Every call is bounded by `storage.s3.api.call.timeout.ms` (per attempt) and tried
up to `storage.s3.retry.max.attempts` times, with exponential back-off and full
jitter (`storage.s3.retry.backoff.ms` doubling up to `storage.s3.retry.backoff.max.ms`),
on throttling (SlowDown, 429, Throttling*), 5xx, timeouts and connection errors;
other errors raise `RemoteStorageError(retriable=False)` at once, a configuration
mistake (a missing bucket, refused credentials, another region) in words that name
the bucket and the property to fix (`s3_errors`). botocore's own retries are off.
Attempts and failed clean-ups are logged at DEBUG: the caller reports the outcome,
once. `check()` is one HeadBucket, not retried.

Settings (the `rsm.config.` prefix removed), named as Aiven's plugin names them:
`storage.s3.bucket.name` (required), `storage.s3.region` (us-east-1),
`storage.s3.endpoint.url`, `storage.s3.path.style.access.enabled` (false),
`storage.s3.ca.bundle` (PEM certificates of the CAs that may sign an https endpoint's
certificate, botocore's `ca_bundle`; unset: the system's, or `AWS_CA_BUNDLE`; an
untrusted certificate is a configuration mistake, not retried),
`storage.aws.access.key.id` and `storage.aws.secret.access.key` (both or neither:
without them the default AWS credential chain is used), `key.prefix`,
`key.prefix.entropy.bits`, `cluster.id`; tuning: `storage.s3.multipart.upload.part.size`
(8 MiB, at least 5 MiB), `storage.s3.api.call.timeout.ms` (30000),
`storage.s3.retry.max.attempts` (5), `storage.s3.retry.backoff.ms` (100),
`storage.s3.retry.backoff.max.ms` (5000), `storage.s3.max.connections` (50).

Every request is counted on the plugin's `meter` by topic and kind, each attempt (a
retry is a request the endpoint sees), with the bytes of the bodies sent and received.

The clients and the reader threads (at most `storage.s3.max.connections`) are
created by `start()` (or on first use), in the running event loop, and closed by
`close()`; one instance serves one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import botocore.session
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

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
from tierbroker.storage.remote.s3_errors import (
    ENDPOINT_PROPERTY,
    NOT_FOUND_CODES,
    RETRIABLE_EXCEPTIONS,
    error_code,
    explain,
    explain_client_error,
    is_retriable,
    untrusted_certificate,
)
from tierbroker.storage.remote.s3_payload import HashedBody, sign_prehashed_payloads
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

log = logging.getLogger(__name__)

T = TypeVar("T")
Operation = Callable[[], Awaitable[T]]

MIB = 1024 * 1024
DEFAULT_PART_BYTES = 8 * MIB
MIN_PART_BYTES = 5 * MIB  # S3's minimum for every part but the last
MAX_PART_BYTES = 5 * 1024 * MIB
MAX_PARTS = 10_000
INDEXES_OBJECTS_KEPT = 4  # the last few segments' indexes objects (each at most a few MiB)


def backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    """Full-jitter back-off after failed attempt n (from 1): U(0, min(max, base * 2^(n-1)))."""
    return random.uniform(0, min(max_s, base_s * 2 ** (attempt - 1)))


class S3RemoteStorageManager(RemoteStorageManager):
    def __init__(self) -> None:
        super().__init__()
        self.layout = ObjectKeyLayout()
        self.bucket = ""
        self.where = ""  # the bucket and where it is, for messages
        self.part_size = DEFAULT_PART_BYTES
        self.call_timeout_s = 30.0
        self.max_attempts = 5
        self.backoff_s = 0.1
        self.backoff_max_s = 5.0
        self.max_connections = 50
        self._client_args: dict[str, Any] = {}
        self._client_config: dict[str, Any] = {}
        self._client_context: Any = None
        self._client: Any = None
        self._reader: Any = None  # botocore's synchronous client, for GETs
        self._reader_threads: ThreadPoolExecutor | None = None
        self._client_lock: asyncio.Lock | None = None
        self._cleanups: set[asyncio.Task[None]] = set()
        self._indexes_objects: OrderedDict[str, asyncio.Task[bytes]] = OrderedDict()
        self.transforms = TransformConfig()
        self.manifests = ManifestCache(self.transforms.keys, self._read_manifest)

    def configure(self, configs: Mapping[str, str]) -> None:
        bucket = configs.get("storage.s3.bucket.name", "")
        if not bucket:
            raise ValueError("storage.s3.bucket.name is required")
        self.bucket = bucket
        self.part_size = _int(
            configs,
            "storage.s3.multipart.upload.part.size",
            DEFAULT_PART_BYTES,
            MIN_PART_BYTES,
            MAX_PART_BYTES,
        )
        self.call_timeout_s = _int(configs, "storage.s3.api.call.timeout.ms", 30_000, 1) / 1000
        self.max_attempts = _int(configs, "storage.s3.retry.max.attempts", 5, 1)
        self.backoff_s = _int(configs, "storage.s3.retry.backoff.ms", 100, 0) / 1000
        self.backoff_max_s = _int(configs, "storage.s3.retry.backoff.max.ms", 5_000, 0) / 1000
        self.layout = ObjectKeyLayout(
            prefix=configs.get("key.prefix", ""),
            entropy_bits=_int(configs, "key.prefix.entropy.bits", 0, 0, 32),
            cluster=configs.get("cluster.id", "cluster"),
        )
        self.transforms = TransformConfig.from_configs(configs)
        self.manifests = ManifestCache(
            self.transforms.keys, self._read_manifest, manifest_cache_size(configs)
        )
        key_id = configs.get("storage.aws.access.key.id") or None
        secret = configs.get("storage.aws.secret.access.key") or None
        if (key_id is None) != (secret is None):
            raise ValueError(
                "storage.aws.access.key.id and storage.aws.secret.access.key go together"
            )
        path_style = _bool(configs, "storage.s3.path.style.access.enabled", False)
        endpoint = configs.get("storage.s3.endpoint.url") or None
        region = configs.get("storage.s3.region") or "us-east-1"
        self.where = f"S3 bucket '{bucket}' at {endpoint or f'AWS region {region}'}"
        self._client_args = {
            "region_name": region,
            "endpoint_url": endpoint,
            "aws_access_key_id": key_id,
            "aws_secret_access_key": secret,
        }
        self.max_connections = _int(configs, "storage.s3.max.connections", 50, 1)
        self._client_config = {  # for both clients
            "s3": {"addressing_style": "path" if path_style else "auto"},
            "retries": {"total_max_attempts": 1, "mode": "standard"},  # retried here
            # Checksums only where S3 requires them, as botocore did before 1.36: its
            # streamed CRC32 costs a third of an 8 MiB PUT on the event loop, and
            # S3-compatible stores often refuse the new headers. Without a checksum
            # header botocore signs the payload's SHA-256, which guards the bytes.
            "request_checksum_calculation": "when_required",
            "connect_timeout": self.call_timeout_s,
            "read_timeout": self.call_timeout_s,
            "max_pool_connections": self.max_connections,
        }
        # Plain HTTP has no certificate to verify; loading the CA bundle for it anyway cost
        # the first request tens of milliseconds of CPU. HTTPS verifies the endpoint's
        # certificate with `storage.s3.ca.bundle` if set, else botocore's own choice, which
        # honours AWS_CA_BUNDLE and the profile's ca_bundle.
        ca_bundle = configs.get("storage.s3.ca.bundle") or None
        if (endpoint or "").lower().startswith("http://"):
            if ca_bundle is not None:
                raise ValueError(
                    f"storage.s3.ca.bundle is set, but storage.s3.endpoint.url={endpoint} is "
                    "plain HTTP: use an https:// endpoint, or unset storage.s3.ca.bundle"
                )
            self._client_args["verify"] = False
        elif ca_bundle is not None:
            self._client_args["verify"] = _ca_bundle(ca_bundle)

    async def start(self) -> None:
        await self.client()

    async def client(self) -> Any:
        """The aiobotocore S3 client, created on first use in the running event loop."""
        if self._client is None:
            if not self.bucket:
                raise RemoteStorageError("the S3 plugin is not configured", retriable=False)
            if self._client_lock is None:
                self._client_lock = asyncio.Lock()
            async with self._client_lock:
                if self._client is None:
                    reader = _reader_session().create_client(
                        "s3", config=Config(**self._client_config), **self._client_args
                    )
                    context = _session().create_client(
                        "s3", config=AioConfig(**self._client_config), **self._client_args
                    )
                    client = await context.__aenter__()
                    sign_prehashed_payloads(client.meta.events)
                    self._reader = reader
                    self._reader_threads = ThreadPoolExecutor(
                        self.max_connections, thread_name_prefix="s3-reader"
                    )
                    self._client, self._client_context = client, context
        return self._client

    async def reader(self) -> Any:
        """botocore's synchronous S3 client, for GETs in the reader threads."""
        await self.client()
        return self._reader

    async def _call(self, what: str, operation: Operation[T]) -> T:
        """Run one S3 operation, each attempt under the call timeout, retrying what may pass."""
        attempt = 1
        while True:
            error: BaseException
            try:
                async with asyncio.timeout(self.call_timeout_s):  # in this task: no hop per call
                    return await operation()
            except ClientError as e:
                code, status = error_code(e)
                if code in NOT_FOUND_CODES:
                    raise RemoteResourceNotFoundError(f"{what}: {code}") from e
                if not is_retriable(code, status):
                    reason = explain(code, status, self.bucket, self.where)
                    message = f"{what}: {code}: {reason}" if reason else f"{what}: {e}"
                    raise RemoteStorageError(message, retriable=False) from e
                error = e
            except RETRIABLE_EXCEPTIONS as e:
                if (untrusted := untrusted_certificate(e, self.where)) is not None:
                    raise RemoteStorageError(f"{what}: {untrusted}", retriable=False) from e
                error = e
            except BotoCoreError as e:  # credentials, parameters: trying again will not help
                reason = explain_client_error(e) or str(e)
                raise RemoteStorageError(f"{what}: {reason}", retriable=False) from e
            reason = str(error) or f"{type(error).__name__} (after {self.call_timeout_s:g}s)"
            if attempt >= self.max_attempts:
                raise RemoteStorageError(
                    f"{what}: failed {attempt} times, last: {reason}", retriable=True
                ) from error
            delay = backoff_s(attempt, self.backoff_s, self.backoff_max_s)
            log.debug(  # the caller reports the call's outcome, once
                "%s failed (attempt %d of %d), retrying in %.2fs: %s",
                what,
                attempt,
                self.max_attempts,
                delay,
                reason,
            )
            await asyncio.sleep(delay)
            attempt += 1

    async def check(self, timeout_s: float) -> bool:
        """One HeadBucket, not retried: the bucket exists, the credentials are accepted and
        the endpoint answers."""
        try:
            async with asyncio.timeout(timeout_s):
                await (await self.client()).head_bucket(Bucket=self.bucket)
        except ClientError as e:
            code, status = error_code(e)
            reason = explain(code, status, self.bucket, self.where) or f"{self.where}: {e}"
            raise RemoteStorageError(reason, retriable=is_retriable(code, status)) from e
        except TimeoutError as e:
            raise RemoteStorageError(
                f"{self.where}: no answer within {timeout_s:g}s: check {ENDPOINT_PROPERTY}"
            ) from e
        except RETRIABLE_EXCEPTIONS as e:
            if (untrusted := untrusted_certificate(e, self.where)) is not None:
                raise RemoteStorageError(untrusted, retriable=False) from e
            raise RemoteStorageError(
                f"{self.where}: cannot reach it ({e}): check {ENDPOINT_PROPERTY}"
            ) from e
        except BotoCoreError as e:
            reason = explain_client_error(e) or str(e)
            raise RemoteStorageError(f"{self.where}: {reason}", retriable=False) from e
        return True

    def _request(self, method: str, topic: str, kind: RequestKind, **kwargs: Any) -> Operation[Any]:
        """An operation calling aiobotocore client method `method` on this bucket; each
        attempt is counted as a `kind` request about `topic`, with its body's bytes."""
        upload_bytes = _size(kwargs.get("Body"))

        async def call() -> Any:
            client = await self.client()
            self.meter.request(topic, kind)
            if upload_bytes:
                self.meter.transferred(topic, Transfer.UPLOAD, upload_bytes)
            return await getattr(client, method)(Bucket=self.bucket, **kwargs)

        return call

    # Copy ----------------------------------------------------------------------------

    async def copy_log_segment_data(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> bytes:
        uploads: dict[str, str | None] = {}  # multipart uploads begun and not completed
        try:
            stored = await self._copy(metadata, data, uploads)
        except asyncio.CancelledError:
            self._in_background(self._clean_up(metadata, uploads))
            raise
        except Exception as e:
            await self._clean_up(metadata, uploads)
            while isinstance(e, ExceptionGroup):  # from the concurrent uploads: the first says why
                e = e.exceptions[0]
            if isinstance(e, RemoteStorageError):
                raise e
            raise RemoteStorageError(
                f"copying segment {metadata.segment_id.id}: {type(e).__name__}: {e}",
                retriable=isinstance(e, OSError),
            ) from e
        self.manifests.put(metadata.segment_id.id, stored)
        return stored_tag(stored.transform)

    async def _copy(
        self,
        metadata: RemoteLogSegmentMetadata,
        data: LogSegmentData,
        uploads: dict[str, str | None],
    ) -> StoredSegment:
        topic = _topic(metadata)
        log_key = self.layout.segment_key(metadata, LOG_SUFFIX)
        indexes_key = self.layout.segment_key(metadata, INDEXES_SUFFIX)
        self._indexes_objects.pop(indexes_key, None)
        loop = asyncio.get_running_loop()
        opening = loop.run_in_executor(None, _open, data.log_segment)
        try:
            fd, size = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The open goes on in its thread: close what it opens.
            opening.add_done_callback(_close_opened)
            raise
        try:
            compress = self.transforms.compression and await loop.run_in_executor(
                None, compressible, fd, size
            )
            transform = SegmentTransform.for_upload(
                metadata.segment_id.id, self.transforms, compress
            )
            encoder = ObjectEncoder(fd, size, transform, self.transforms.chunk_bytes)
            # The log and the indexes go up together; a failure cancels the other before
            # clean-up starts, so nothing is written after it.
            async with asyncio.TaskGroup() as group:
                group.create_task(self._upload(encoder, topic, log_key, uploads))
                bundle = await loop.run_in_executor(None, read_index_bundle, data)
                indexes, indexes_entry = await loop.run_in_executor(
                    None, encode_indexes, transform, bundle
                )
                group.create_task(self._put(topic, indexes_key, indexes))
        finally:
            os.close(fd)
        entries = {LOG_SUFFIX: encoder.entry(), INDEXES_SUFFIX: indexes_entry}
        manifest = manifest_json(metadata, self.layout, entries)
        await self._put(topic, self.layout.segment_key(metadata, MANIFEST_SUFFIX), manifest)
        return StoredSegment(StoredFormat.from_json(entries[LOG_SUFFIX]), transform)

    async def _put(self, topic: str, key: str, body: bytes | HashedBody) -> None:
        await self._call(
            f"PutObject {key}",
            self._request("put_object", topic, RequestKind.PUT, Key=key, Body=body),
        )

    async def _upload(
        self, encoder: ObjectEncoder, topic: str, key: str, uploads: dict[str, str | None]
    ) -> None:
        """The encoder's bytes as one object: one PUT, or a part at a time above the part
        size (at most one part in memory)."""
        loop = asyncio.get_running_loop()
        part_size = max(self.part_size, math.ceil(encoder.size / MAX_PARTS))
        body = await loop.run_in_executor(None, _read_part, encoder, part_size)
        if encoder.done:
            await self._put(topic, key, body)
            return
        uploads[key] = None  # begun: if the answer is lost, clean-up finds it by listing
        created = await self._call(
            f"CreateMultipartUpload {key}",
            self._request("create_multipart_upload", topic, RequestKind.PUT, Key=key),
        )
        upload_id: str = created["UploadId"]
        uploads[key] = upload_id
        parts: list[dict[str, Any]] = []
        while True:
            number = len(parts) + 1
            response = await self._call(
                f"UploadPart {key} #{number}",
                self._request(
                    "upload_part",
                    topic,
                    RequestKind.PUT,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=body,
                ),
            )
            parts.append({"ETag": response["ETag"], "PartNumber": number})
            if encoder.done:
                break
            del body  # at most one part in memory: freed before the next is read
            body = await loop.run_in_executor(None, _read_part, encoder, part_size)
        await self._call(
            f"CompleteMultipartUpload {key}",
            self._request(
                "complete_multipart_upload",
                topic,
                RequestKind.PUT,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            ),
        )
        del uploads[key]

    async def _clean_up(
        self, metadata: RemoteLogSegmentMetadata, uploads: dict[str, str | None]
    ) -> None:
        """After a failed copy: abort its multipart uploads, delete its objects. Never raises."""
        for key, upload_id in uploads.items():
            await self._abort_uploads(_topic(metadata), key, upload_id)
        try:
            await self.delete_log_segment_data(metadata)
        except Exception as e:
            log.debug("cleaning up segment %s failed: %s", metadata.segment_id.id, e)

    async def _abort_uploads(self, topic: str, key: str, upload_id: str | None) -> None:
        """Abort every unfinished multipart upload of `key` (or at least `upload_id`)."""
        try:
            listed = await self._call(
                f"ListMultipartUploads {key}",
                self._request("list_multipart_uploads", topic, RequestKind.LIST, Prefix=key),
            )
            ids = {u["UploadId"] for u in listed.get("Uploads", []) if u.get("Key") == key}
        except RemoteStorageError as e:
            log.debug("listing the multipart uploads of %s failed: %s", key, e)
            ids = set()
        if upload_id is not None:
            ids.add(upload_id)
        for uid in ids:
            try:
                await self._call(
                    f"AbortMultipartUpload {key}",
                    self._request(
                        "abort_multipart_upload", topic, RequestKind.DELETE, Key=key, UploadId=uid
                    ),
                )
            except RemoteResourceNotFoundError:
                pass
            except RemoteStorageError as e:
                if "NoSuchUpload" not in str(e):
                    log.debug("aborting the multipart upload of %s failed: %s", key, e)

    def _in_background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    # Reads ---------------------------------------------------------------------------

    async def fetch_log_segment(
        self,
        metadata: RemoteLogSegmentMetadata,
        start_position: int,
        end_position: int | None = None,
    ) -> bytes:
        if start_position < 0:
            raise ValueError(f"negative start position {start_position}")
        if end_position is not None and end_position < start_position:
            return b""  # S3 would ignore such a Range and send the whole object
        key = self.layout.segment_key(metadata, LOG_SUFFIX)
        topic = _topic(metadata)
        stored = await self.manifests.get(metadata)
        if stored.transform is None:
            last = "" if end_position is None else str(end_position)
            return await self._get(topic, key, f"bytes={start_position}-{last}")

        async def get(start: int, end: int) -> bytes:
            return await self._get(topic, key, f"bytes={start}-{end - 1}")

        size = metadata.segment_size_bytes
        return await stored.read_chunked(
            size, start_position, end_position, get, self._reader_threads
        )

    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        key = self.layout.segment_key(metadata, INDEXES_SUFFIX)
        stored = await self.manifests.get(metadata)
        bundle = await self._indexes_object(_topic(metadata), key)
        if stored.transform is not None:
            bundle = await asyncio.get_running_loop().run_in_executor(
                self._reader_threads, decode_indexes, stored.transform, bundle
            )
        return index_from_bundle(key, bundle, index_type)

    async def _read_manifest(self, metadata: RemoteLogSegmentMetadata) -> bytes:
        key = self.layout.segment_key(metadata, MANIFEST_SUFFIX)
        return await self._get(_topic(metadata), key, None)

    async def _indexes_object(self, topic: str, key: str) -> bytes:
        """The indexes object at `key`, from one GET for all its indexes: a lookup by
        timestamp asks for the time index, then for the offset index. A failed GET is
        forgotten; one a fetch stopped waiting for goes on and is kept."""
        getting = self._indexes_objects.get(key)
        if getting is None:
            getting = asyncio.get_running_loop().create_task(self._get(topic, key, None))
            getting.add_done_callback(functools.partial(self._indexes_object_done, key))
            self._indexes_objects[key] = getting
            while len(self._indexes_objects) > INDEXES_OBJECTS_KEPT:
                self._indexes_objects.popitem(last=False)
        else:
            self._indexes_objects.move_to_end(key)
        return await asyncio.shield(getting)

    def _indexes_object_done(self, key: str, getting: asyncio.Task[bytes]) -> None:
        if getting.cancelled() or getting.exception() is not None:
            if self._indexes_objects.get(key) is getting:
                del self._indexes_objects[key]

    async def _get(self, topic: str, key: str, byte_range: str | None) -> bytes:
        args = {"Bucket": self.bucket, "Key": key}
        if byte_range is not None:
            args["Range"] = byte_range
        loop = asyncio.get_running_loop()

        async def get() -> bytes:
            reader = await self.reader()
            self.meter.request(topic, RequestKind.GET)
            body = await loop.run_in_executor(self._reader_threads, _get_object, reader, args)
            self.meter.transferred(topic, Transfer.DOWNLOAD, len(body))
            return body

        return await self._call(f"GetObject {key} {byte_range or ''}".rstrip(), get)

    # Delete --------------------------------------------------------------------------

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._indexes_objects.pop(self.layout.segment_key(metadata, INDEXES_SUFFIX), None)
        self.manifests.remove(metadata.segment_id.id)
        topic = _topic(metadata)
        *rest, manifest = self.layout.all_keys(metadata)
        # The manifest first: readers stop trusting the segment before its data goes.
        await self._call(
            f"DeleteObject {manifest}",
            self._request("delete_object", topic, RequestKind.DELETE, Key=manifest),
        )
        request = self._request(
            "delete_objects",
            topic,
            RequestKind.DELETE,
            Delete={"Objects": [{"Key": k} for k in rest], "Quiet": True},
        )

        async def delete() -> None:
            response = await request()
            errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:  # per-key failures come in a 200 answer: classify them as a call's
                raise ClientError({"Error": errors[0]}, "DeleteObjects")

        await self._call(f"DeleteObjects {len(rest)} objects of {manifest}", delete)

    # Partition index ------------------------------------------------------------------

    async def write_partition_index(self, tip: TopicIdPartition, document: bytes) -> bool:
        """One PutObject: S3 replaces an object whole."""
        await self._put(tip.topic_partition.topic, self.layout.partition_index_key(tip), document)
        return True

    async def delete_partition_index(self, tip: TopicIdPartition) -> None:
        key = self.layout.partition_index_key(tip)
        await self._call(
            f"DeleteObject {key}",
            self._request("delete_object", tip.topic_partition.topic, RequestKind.DELETE, Key=key),
        )

    async def close(self) -> None:
        """Let background clean-ups finish (within the call timeout), then close the client."""
        gets = list(self._indexes_objects.values())
        self._indexes_objects.clear()
        for get in gets:
            get.cancel()
        await asyncio.gather(*gets, return_exceptions=True)
        if self._cleanups:
            _, pending = await asyncio.wait(self._cleanups, timeout=self.call_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        context, self._client_context, self._client = self._client_context, None, None
        if context is not None:
            with contextlib.suppress(Exception):
                await context.__aexit__(None, None, None)
        # Nothing awaits a GET still in a reader thread: it ends on its own, or once it
        # has received nothing for the read timeout.
        if self._reader_threads is not None:
            self._reader_threads.shutdown(wait=False, cancel_futures=True)
            self._reader.close()
        self._reader, self._reader_threads = None, None


@functools.cache
def _session() -> Any:
    """One aiobotocore session for every plugin: it loads the S3 service model once."""
    return get_session()


@functools.cache
def _reader_session() -> botocore.session.Session:
    """One botocore session for every plugin's reader client, likewise; it reads the model
    through the aiobotocore session's loader, so that the model is loaded once."""
    session = botocore.session.get_session()
    session.register_component("data_loader", _session().get_component("data_loader"))
    return session


def _topic(metadata: RemoteLogSegmentMetadata) -> str:
    return metadata.topic_id_partition.topic_partition.topic


def _size(body: bytes | HashedBody | None) -> int:
    """The bytes a request body sends."""
    if body is None:
        return 0
    if isinstance(body, HashedBody):
        with body.getbuffer() as view:
            return view.nbytes
    return len(body)


def _read_part(encoder: ObjectEncoder, part_size: int) -> HashedBody:
    """The next part of an upload, hashed for its signature (in an executor thread)."""
    return HashedBody(encoder.read(part_size))


def _get_object(s3: Any, args: dict[str, str]) -> bytes:
    """One GET, in a reader thread; a range starting at or after the end reads nothing,
    as a file read would."""
    try:
        response = s3.get_object(**args)
    except ClientError as e:
        if "Range" in args and error_code(e)[0] == "InvalidRange":
            return b""
        raise
    with contextlib.closing(response["Body"]) as body:
        data: bytes = body.read()
        return data


def _int(
    configs: Mapping[str, str],
    name: str,
    default: int,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    text = configs.get(name)
    try:
        value = default if text is None or text == "" else int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name}={value} must be in [{minimum}, {maximum}]")
    return value


def _ca_bundle(path: str) -> str:
    """`storage.s3.ca.bundle`: a file of PEM certificates, checked before any request."""
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as e:
        raise ValueError(f"storage.s3.ca.bundle={path}: cannot read it: {e.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(f"storage.s3.ca.bundle={path}: holds no PEM certificate")
    return path


def _bool(configs: Mapping[str, str], name: str, default: bool) -> bool:
    text = configs.get(name, "").strip().lower()
    if text in ("", "true", "false"):
        return default if text == "" else text == "true"
    raise ValueError(f"{name}={text!r} must be true or false")


def _close_opened(opening: asyncio.Future[tuple[int, int]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        os.close(opening.result()[0])


def _open(path: Path) -> tuple[int, int]:
    """A read-only descriptor of `path` and its size (kept open: a deletion cannot cut a copy)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return fd, os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
