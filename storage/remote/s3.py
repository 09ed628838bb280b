"""`S3RemoteStorageManager`: the remote tier in an S3 bucket (AWS, MinIO, or any S3 endpoint).

Objects are named by `ObjectKeyLayout`. A segment is uploaded with PutObject, or
with a multipart upload above `storage.s3.multipart.upload.part.size` (aborted on
failure), reading the file a part at a time in the default executor; its indexes
follow and its manifest goes last. If any upload fails, every object of the
segment is deleted before the error is raised, so no orphans stay behind. Reads
are ranged GETs. Every call is bounded by `storage.s3.api.call.timeout.ms` and
retried with exponential back-off and full jitter on throttling, 5xx and
connection errors; other errors are not retried.

Settings (the `rsm.config.` prefix removed), named as Aiven's plugin names them:
`storage.s3.bucket.name`, `storage.s3.region`, `storage.s3.endpoint.url`,
`storage.s3.path.style.access.enabled`, `storage.aws.access.key.id`,
`storage.aws.secret.access.key`, `storage.s3.multipart.upload.part.size`,
`storage.s3.api.call.timeout.ms`, `key.prefix`, `key.prefix.entropy.bits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from storage.remote.key_layout import LOG_SUFFIX, MANIFEST_SUFFIX, ObjectKeyLayout, manifest_json
from storage.remote.segment_metadata import RemoteLogSegmentMetadata
from storage.remote.storage_manager import (
    IndexType,
    LogSegmentData,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageManager,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRIABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "503",
        "500",
        "429",
    }
)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
MIN_PART_BYTES = 5 * 1024 * 1024


class S3RemoteStorageManager(RemoteStorageManager):
    def __init__(self) -> None:
        self.layout = ObjectKeyLayout()
        self.bucket = ""
        self.part_size = 8 * 1024 * 1024
        self.call_timeout_s = 30.0
        self.max_attempts = 5
        self.backoff_s = 0.1
        self.backoff_max_s = 5.0
        self._client_args: dict[str, Any] = {}
        self._client: Any = None
        self._stack = contextlib.AsyncExitStack()
        self._client_lock: asyncio.Lock | None = None

    def configure(self, configs: Mapping[str, str]) -> None:
        self.bucket = configs["storage.s3.bucket.name"]
        self.part_size = max(
            int(configs.get("storage.s3.multipart.upload.part.size", self.part_size)),
            MIN_PART_BYTES,
        )
        self.call_timeout_s = int(configs.get("storage.s3.api.call.timeout.ms", "30000")) / 1000
        self.max_attempts = int(configs.get("storage.s3.retry.max.attempts", self.max_attempts))
        self.layout = ObjectKeyLayout(
            prefix=configs.get("key.prefix", ""),
            entropy_bits=int(configs.get("key.prefix.entropy.bits", "0")),
            cluster=configs.get("cluster.id", "cluster"),
        )
        path_style = configs.get("storage.s3.path.style.access.enabled", "false").lower() == "true"
        self._client_args = {
            "region_name": configs.get("storage.s3.region", "us-east-1"),
            "endpoint_url": configs.get("storage.s3.endpoint.url") or None,
            "aws_access_key_id": configs.get("storage.aws.access.key.id") or None,
            "aws_secret_access_key": configs.get("storage.aws.secret.access.key") or None,
            "config": AioConfig(
                s3={"addressing_style": "path" if path_style else "auto"},
                retries={"max_attempts": 1},  # retried here, with jitter and our own timeout
                connect_timeout=self.call_timeout_s,
                read_timeout=self.call_timeout_s,
            ),
        }

    async def _s3(self) -> Any:
        if self._client is None:
            if self._client_lock is None:
                self._client_lock = asyncio.Lock()
            async with self._client_lock:
                if self._client is None:
                    session = get_session()
                    self._client = await self._stack.enter_async_context(
                        session.create_client("s3", **self._client_args)
                    )
        return self._client

    async def _call(self, what: str, operation: Callable[[Any], Awaitable[T]]) -> T:
        """Run one S3 operation with a timeout, retrying what S3 says may be retried."""
        client = await self._s3()
        for attempt in range(1, self.max_attempts + 1):
            try:
                return await asyncio.wait_for(operation(client), self.call_timeout_s)
            except ClientError as e:
                code = str(e.response.get("Error", {}).get("Code", ""))
                status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
                if code in NOT_FOUND_CODES or status == "404":
                    raise RemoteResourceNotFoundError(f"{what}: not found") from e
                retriable = (
                    code in RETRIABLE_CODES or status in RETRIABLE_CODES or status.startswith("5")
                )
                if not retriable or attempt == self.max_attempts:
                    raise RemoteStorageError(f"{what}: {code or status}: {e}", retriable) from e
                error: BaseException = e
            except (
                BotoCoreError,
                OSError,
                TimeoutError,
            ) as e:  # connection trouble, or our timeout
                if attempt == self.max_attempts:
                    raise RemoteStorageError(f"{what}: {type(e).__name__}: {e}") from e
                error = e
            delay = random.uniform(0, min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1)))
            log.info(
                "%s failed (attempt %d of %d), retrying in %.2fs: %s",
                what,
                attempt,
                self.max_attempts,
                delay,
                error,
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    # Copy ----------------------------------------------------------------------------

    async def copy_log_segment_data(
        self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData
    ) -> None:
        try:
            sizes = {
                LOG_SUFFIX: await self._upload_file(
                    data.log_segment, self.layout.segment_key(metadata, LOG_SUFFIX)
                )
            }
            for index_type, source in data.indexes().items():
                key = self.layout.index_key(metadata, index_type)
                if isinstance(source, Path):
                    sizes[index_type.value] = await self._upload_file(source, key)
                else:
                    sizes[index_type.value] = await self._put(key, source)
            manifest = manifest_json(metadata, self.layout, sizes)
            await self._put(self.layout.segment_key(metadata, MANIFEST_SUFFIX), manifest)
        except BaseException:
            with contextlib.suppress(RemoteStorageError):
                await asyncio.shield(self.delete_log_segment_data(metadata))
            raise

    async def _put(self, key: str, body: bytes) -> int:
        await self._call(
            f"PUT {key}", lambda s3: s3.put_object(Bucket=self.bucket, Key=key, Body=body)
        )
        return len(body)

    async def _upload_file(self, path: Path, key: str) -> int:
        loop = asyncio.get_running_loop()
        size = (await loop.run_in_executor(None, os.stat, path)).st_size
        if size <= self.part_size:
            return await self._put(key, await loop.run_in_executor(None, path.read_bytes))
        created = await self._call(
            f"CreateMultipartUpload {key}",
            lambda s3: s3.create_multipart_upload(Bucket=self.bucket, Key=key),
        )
        upload_id = created["UploadId"]
        try:
            parts = []
            for number, start in enumerate(range(0, size, self.part_size), start=1):
                body = await loop.run_in_executor(None, _read_range, path, start, self.part_size)
                part = await self._call(
                    f"UploadPart {key} #{number}",
                    _upload_part(self.bucket, key, upload_id, number, body),
                )
                parts.append({"ETag": part["ETag"], "PartNumber": number})
            await self._call(
                f"CompleteMultipartUpload {key}",
                lambda s3: s3.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                ),
            )
        except BaseException:
            with contextlib.suppress(RemoteStorageError):
                await asyncio.shield(
                    self._call(
                        f"AbortMultipartUpload {key}",
                        lambda s3: s3.abort_multipart_upload(
                            Bucket=self.bucket, Key=key, UploadId=upload_id
                        ),
                    )
                )
            raise
        return size

    # Reads ---------------------------------------------------------------------------

    async def fetch_log_segment(
        self,
        metadata: RemoteLogSegmentMetadata,
        start_position: int,
        end_position: int | None = None,
    ) -> bytes:
        end = "" if end_position is None else str(end_position)
        return await self._get(
            self.layout.segment_key(metadata, LOG_SUFFIX), f"bytes={start_position}-{end}"
        )

    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        return await self._get(self.layout.index_key(metadata, index_type), None)

    async def _get(self, key: str, byte_range: str | None) -> bytes:
        async def get(s3: Any) -> bytes:
            args = {
                "Bucket": self.bucket,
                "Key": key,
                **({"Range": byte_range} if byte_range else {}),
            }
            response = await s3.get_object(**args)
            async with response["Body"] as body:
                return bytes(await body.read())

        return await self._call(f"GET {key} {byte_range or ''}", get)

    # Delete --------------------------------------------------------------------------

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        keys = self.layout.all_keys(metadata)
        manifest, rest = keys[-1], keys[:-1]
        # The manifest first: readers stop trusting the segment before its data goes.
        await self._call(
            f"DELETE {manifest}", lambda s3: s3.delete_object(Bucket=self.bucket, Key=manifest)
        )
        await self._call(
            f"DELETE {len(rest)} objects",
            lambda s3: s3.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in rest], "Quiet": True}
            ),
        )

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None


def _upload_part(
    bucket: str, key: str, upload_id: str, number: int, body: bytes
) -> Callable[[Any], Awaitable[Any]]:
    def upload(s3: Any) -> Any:
        return s3.upload_part(
            Bucket=bucket, Key=key, PartNumber=number, UploadId=upload_id, Body=body
        )

    return upload


def _read_range(path: Path, start: int, length: int) -> bytes:
    with open(path, "rb") as f:
        return os.pread(f.fileno(), length, start)
