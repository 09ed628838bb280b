"""`ObjectStoreMeter`: what a remote storage plugin asks of its store, per topic.

Requests are counted by the classes object stores bill by (`RequestKind`), every attempt
as the endpoint sees it: a retry is one more request. Bytes are counted by direction:
`UPLOAD`, request bodies sent (every attempt's), and `DOWNLOAD`, bodies received. The
classes, as S3's and Cloud Storage's pricing pages put the calls a plugin makes:

- PUT: PutObject, CreateMultipartUpload, UploadPart, CompleteMultipartUpload (S3's
  "PUT, COPY, POST, LIST" requests; Cloud Storage's Class A operations)
- LIST: ListMultipartUploads (listings are billed as PUT by both; counted apart, as
  a listing is work the store does for no data)
- GET: GetObject, HeadObject (S3's "GET, SELECT and all other" requests; Class B)
- DELETE: DeleteObject, DeleteObjects, AbortMultipartUpload (S3's "DELETE and CANCEL"
  requests and Cloud Storage's deletes are free; counted all the same)

The LocalFs plugin counts its file operations as the requests an object store would see
for them (a file written is a PUT, read a GET, removed a DELETE). A plugin's start check
(`check()`) belongs to no topic and is not counted.

Safe to share between threads (plugins count in executor threads): one lock, held for
one dictionary update. A topic's counts go with `forget`, when the topic is deleted.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field


class RequestKind(enum.Enum):
    PUT = "put"
    GET = "get"
    LIST = "list"
    DELETE = "delete"


class Transfer(enum.Enum):
    UPLOAD = "upload"  # to the store: request bodies
    DOWNLOAD = "download"  # from the store: response bodies


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectStoreUsage:
    """One topic's requests by kind and bytes by direction, since the broker started."""

    requests: dict[RequestKind, int] = field(default_factory=dict)
    bytes: dict[Transfer, int] = field(default_factory=dict)


class ObjectStoreMeter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, RequestKind], int] = {}
        self._bytes: dict[tuple[str, Transfer], int] = {}

    def request(self, topic: str, kind: RequestKind) -> None:
        """One request about `topic`'s objects was sent (or is about to be)."""
        with self._lock:
            self._requests[topic, kind] = self._requests.get((topic, kind), 0) + 1

    def transferred(self, topic: str, direction: Transfer, size_bytes: int) -> None:
        """`size_bytes` of `topic`'s objects went `direction`."""
        with self._lock:
            self._bytes[topic, direction] = self._bytes.get((topic, direction), 0) + size_bytes

    def usage(self) -> dict[str, ObjectStoreUsage]:
        """Every topic's counts, copied."""
        with self._lock:
            requests, transfers = dict(self._requests), dict(self._bytes)
        by_kind: dict[str, dict[RequestKind, int]] = {}
        by_direction: dict[str, dict[Transfer, int]] = {}
        for (topic, kind), count in requests.items():
            by_kind.setdefault(topic, {})[kind] = count
        for (topic, direction), size in transfers.items():
            by_direction.setdefault(topic, {})[direction] = size
        return {
            topic: ObjectStoreUsage(
                requests=by_kind.get(topic, {}), bytes=by_direction.get(topic, {})
            )
            for topic in by_kind.keys() | by_direction.keys()
        }

    def forget(self, topic: str) -> None:
        """Drop `topic`'s counts (it was deleted)."""
        with self._lock:
            for kind in RequestKind:
                self._requests.pop((topic, kind), None)
            for direction in Transfer:
                self._bytes.pop((topic, direction), None)
