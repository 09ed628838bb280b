"""Read-only access to the remote tier's object store, for readers outside the broker.

Readers need three operations, the ones the Pinterest design asks of any remote
store: list keys under a prefix, list the "directories" one level below a prefix,
and read a byte range of one object. Two backends, chosen by URL:

- `file:///path`: the directory a `LocalFsRemoteStorageManager` writes to (its
  `rsm.config.dir`); keys are paths relative to it. In-progress `.tmp` files are
  never listed.
- `s3://bucket/prefix?endpoint=URL&region=NAME&path_style=true`: a bucket of the
  `S3RemoteStorageManager`; the URL's path (after the bucket) is the RSM's
  `key.prefix`, exactly (keep a trailing `/` if the broker's prefix has one).

Options use the RSM's own names (the `rsm.config.` prefix removed), so one set of
settings serves the broker and its readers: `storage.s3.endpoint.url`,
`storage.s3.region`, `storage.s3.path.style.access.enabled`,
`storage.aws.access.key.id`, `storage.aws.secret.access.key`, `key.prefix`, and the
key-encryption keys encrypted segments are read with (`encryption.keys`,
`encryption.keys.<id>.file` or `.env`; see `storage.remote.segment_codec`). Query
parameters of the URL are shorthands for the first three. Without credentials,
botocore's default credential chain applies (environment, shared config, instance role).

One writing operation, `delete`, serves `tierbroker remote verify --delete-orphans`
alone; readers never call it.

The interface is synchronous: Spark executors call it directly, the asyncio
consumer in a thread pool. A store is safe to use from several threads.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from tierbroker.storage.remote.segment_codec import KeyRing

TMP_SUFFIX = ".tmp"


class ObjectNotFoundError(Exception):
    """The object does not exist (never written, or deleted, e.g. by retention)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    last_modified_ms: int  # when it was written (its file's mtime, S3's LastModified)


class ObjectStore(abc.ABC):
    """The few read operations discovery and segment reads need, over one store, and the
    keys its encrypted segments are read with."""

    url: str
    key_prefix: str
    keys: KeyRing = KeyRing({})

    @abc.abstractmethod
    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, at any depth, in key order."""

    @abc.abstractmethod
    def list_prefixes(self, prefix: str) -> list[str]:
        """The distinct `prefix + name + "/"` of keys below `prefix` (S3's CommonPrefixes)."""

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of an object (end None: to its end); short at the object's end.

        Raises `ObjectNotFoundError` if the object does not exist.
        """

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove one object; succeeds if it is already gone."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release connections."""


class LocalObjectStore(ObjectStore):
    """Objects as files under a root directory, as `LocalFsRemoteStorageManager` writes them."""

    def __init__(self, root: Path, key_prefix: str = "") -> None:
        self.root = root
        self.key_prefix = key_prefix
        self.url = root.as_uri()

    def _split(self, prefix: str) -> tuple[Path, str]:
        """The directory a prefix lies in, and the start of names within it."""
        directory, _, start = prefix.rpartition("/")
        return (self.root / directory if directory else self.root), start

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        directory, start = self._split(prefix)
        base = prefix[: len(prefix) - len(start)]
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if not entry.name.startswith(start) or entry.name.endswith(TMP_SUFFIX):
                continue
            key = base + entry.name
            if entry.is_dir():
                yield from self.list_objects(key + "/")
            else:
                try:
                    stat = entry.stat()
                except FileNotFoundError:  # deleted while listing
                    continue
                yield ObjectInfo(key, stat.st_size, stat.st_mtime_ns // 1_000_000)

    def list_prefixes(self, prefix: str) -> list[str]:
        directory, start = self._split(prefix)
        try:
            names = [e.name for e in os.scandir(directory) if e.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = prefix[: len(prefix) - len(start)]
        return sorted(f"{base}{name}/" for name in names if name.startswith(start))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        try:
            with open(self.root / key, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                stop = size if end is None else min(end, size)
                return os.pread(f.fileno(), max(stop - start, 0), start)
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFoundError(f"{self.url}: no object {key}") from None

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)


class S3ObjectStore(ObjectStore):
    """Objects in an S3 bucket (AWS, MinIO, moto), read with botocore's synchronous client.

    botocore, not boto3: it comes with aiobotocore (the broker's S3 plugin), at the
    version aiobotocore pins, so a plain install can read S3 without another package.
    """

    def __init__(
        self,
        bucket: str,
        key_prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        path_style: bool = False,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
    ) -> None:
        import botocore.session
        from botocore.config import Config

        self.bucket = bucket
        self.key_prefix = key_prefix
        self.url = f"s3://{bucket}/{key_prefix}"
        self._client: Any = botocore.session.get_session().create_client(
            "s3",
            region_name=region,
            endpoint_url=endpoint_url,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=Config(
                s3={"addressing_style": "path" if path_style else "auto"},
                retries={"max_attempts": 5, "mode": "standard"},
                max_pool_connections=32,
            ),
        )

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                modified_ms = int(item["LastModified"].timestamp() * 1000)
                yield ObjectInfo(item["Key"], int(item["Size"]), modified_ms)

    def list_prefixes(self, prefix: str) -> list[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        found: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            found.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
        return sorted(found)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        from botocore.exceptions import ClientError

        if end is not None and end <= start:
            return b""  # S3 would ignore such a Range and send the whole object
        byte_range = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            if start == 0 and end is None:
                response = self._client.get_object(Bucket=self.bucket, Key=key)
            else:
                response = self._client.get_object(Bucket=self.bucket, Key=key, Range=byte_range)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "NotFound", "404"):
                raise ObjectNotFoundError(f"{self.url}: no object {key}") from None
            if code == "InvalidRange":
                return b""  # starts at or after the end, as a file read would
            raise
        body = response["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=key)

    def close(self) -> None:
        self._client.close()


def _flag(text: str | None, name: str) -> bool:
    value = (text or "false").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{name}={text!r} must be true or false")
    return value == "true"


def open_store(url: str, options: Mapping[str, str] | None = None) -> ObjectStore:
    """The object store a URL names (`file:///dir` or `s3://bucket/prefix?...`), see above."""
    options = dict(options or {})
    store = _open_store(url, options)
    store.keys = KeyRing.from_configs(options)
    return store


def _open_store(url: str, options: dict[str, str]) -> ObjectStore:
    parsed = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{url}: a file URL names a local directory (file:///path)")
        root = Path(unquote(parsed.path))
        if not root.is_dir():
            raise ValueError(f"{url}: {root} is not a directory")
        return LocalObjectStore(root, options.get("key.prefix", ""))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"{url}: no bucket (s3://bucket/prefix)")
        key_id = options.get("storage.aws.access.key.id") or None
        secret = options.get("storage.aws.secret.access.key") or None
        if (key_id is None) != (secret is None):
            raise ValueError(
                "storage.aws.access.key.id and storage.aws.secret.access.key go together"
            )
        path_style = options.get("storage.s3.path.style.access.enabled", query.get("path_style"))
        return S3ObjectStore(
            parsed.netloc,
            options.get("key.prefix", unquote(parsed.path).removeprefix("/")),
            endpoint_url=options.get("storage.s3.endpoint.url") or query.get("endpoint") or None,
            region=options.get("storage.s3.region") or query.get("region") or "us-east-1",
            path_style=_flag(path_style, "storage.s3.path.style.access.enabled"),
            access_key_id=key_id,
            secret_access_key=secret,
        )
    raise ValueError(f"{url}: unsupported storage URL (use file:///path or s3://bucket/prefix)")
