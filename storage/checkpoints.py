"""Checkpoint files, written atomically: temp file, fsync, rename, fsync of the directory.

Formats are Kafka's, so a Kafka engineer can read them:

- offset checkpoints (`recovery-point-offset-checkpoint`, `log-start-offset-checkpoint`,
  `replication-offset-checkpoint`): a version line `0`, a count line, then
  `topic partition offset` per line;
- `leader-epoch-checkpoint`: `0`, a count, then `epoch start_offset` per line;
- `partition.metadata`: `version: 0` and `topic_id: <base64url uuid>`.

A crash leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import logging
import threading
import uuid
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path

from tierbroker.storage.file_io import replace_durably, write_file
from tierbroker.storage.topic_partition import TopicPartition

VERSION = 0

log = logging.getLogger(__name__)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text`; on an OSError the old file stays and no temp file is left."""
    replace_durably(path, lambda tmp: write_file(tmp, text.encode(), sync=True))


def _read_entries(path: Path, fields: int) -> list[list[str]]:
    """The entry lines of a versioned, counted checkpoint file; [] if it does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return _parse_entries(text, fields, str(path))


def _parse_entries(text: str, fields: int, source: str) -> list[list[str]]:
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != str(VERSION):
        raise ValueError(f"{source}: unrecognised checkpoint header {lines[:2]!r}")
    count = int(lines[1])
    entries = [line.split() for line in lines[2 : 2 + count]]
    if len(entries) != count or any(len(e) != fields for e in entries):
        raise ValueError(f"{source}: expected {count} entries of {fields} fields")
    return entries


def _format(entries: Iterable[str]) -> str:
    lines = list(entries)
    return "\n".join([str(VERSION), str(len(lines)), *lines]) + "\n"


class OffsetCheckpointFile:
    """One offset per partition of a log dir, e.g. recovery points or log start offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[TopicPartition, int]:
        return {
            TopicPartition(topic, int(partition)): int(offset)
            for topic, partition, offset in _read_entries(self.path, 3)
        }

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        lines = (f"{tp.topic} {tp.partition} {offset}" for tp, offset in sorted(offsets.items()))
        write_atomically(self.path, _format(lines))


def read_epoch_entries(path: Path) -> list[tuple[int, int]]:
    return [(int(epoch), int(offset)) for epoch, offset in _read_entries(path, 2)]


def parse_epoch_entries(text: str, source: str) -> list[tuple[int, int]]:
    """The entries of a `leader-epoch-checkpoint` held in memory (one from the remote tier);
    ValueError, naming `source`, if it is not one."""
    entries = _parse_entries(text, 2, source)
    try:
        return [(int(epoch), int(offset)) for epoch, offset in entries]
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def write_epoch_entries(path: Path, entries: Iterable[tuple[int, int]]) -> None:
    write_atomically(path, format_epoch_entries(entries))


class CheckpointWriter:
    """The one writer of a checkpoint file whose writes leave the event loop.

    `submit(text)` records the latest content and, on a running loop, queues the file
    for the loop's `_WriteQueue`, whose one executor job writes the queued files (temp
    file, fsync, rename, fsync of the directory): a failover making 1,000 partitions
    leaders costs the loop no fsync and one executor hand-off. `flush()` writes the
    latest content now, in the calling thread. Invariant: the file ends with the
    content of the latest `submit`: each write takes the lock and writes the latest
    content, so a write that runs late cannot put back older content. A failed write
    in the executor logs one line and is retried by the next `submit` or `flush`.
    `submit` is called from the loop only; `flush` from any thread.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._latest: tuple[int, str] | None = None  # (version, text), set by submit
        self._written_version = 0

    def submit(self, text: str) -> None:
        version = (self._latest[0] if self._latest else 0) + 1
        self._latest = (version, text)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()  # loading or a tool: no loop to keep free
            return
        _WriteQueue.of(loop).add(self)

    async def wait_written(self) -> None:
        """Wait until the writes queued so far on this loop have ended (written, or
        failed and logged)."""
        await _WriteQueue.of(asyncio.get_running_loop()).wait_idle()

    def flush(self) -> None:
        """Write the latest submitted content unless the file has it; raises the OSError."""
        with self._lock:
            latest = self._latest
            if latest is None or latest[0] <= self._written_version:
                return
            write_atomically(self.path, latest[1])
            self._written_version = latest[0]

    def flush_logged(self) -> None:
        try:
            self.flush()
        except OSError as e:
            log.error("%s: checkpoint write failed (retried at the next change): %s", self.path, e)


class _WriteQueue:
    """The checkpoint files of one event loop waiting for a write, and the one executor
    job that writes them in order. Invariant: while the deque is not empty, a job runs
    or its done callback (on the loop) starts the next one."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._writers: collections.deque[CheckpointWriter] = collections.deque()
        self._job: asyncio.Future[None] | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _WriteQueue:
        queue = _WRITE_QUEUES.get(loop)
        if queue is None:
            queue = _WRITE_QUEUES[loop] = cls(loop)
        return queue

    def add(self, writer: CheckpointWriter) -> None:
        self._writers.append(writer)
        if self._job is None:
            self._start()

    def _start(self) -> None:
        self._job = self._loop.run_in_executor(None, self._drain)
        self._job.add_done_callback(self._after_drain)

    def _drain(self) -> None:
        while True:
            try:
                writer = self._writers.popleft()
            except IndexError:
                return
            writer.flush_logged()

    def _after_drain(self, _: asyncio.Future[None]) -> None:
        self._job = None
        if self._writers and not self._loop.is_closed():
            self._start()  # added after the job found the deque empty

    async def wait_idle(self) -> None:
        while self._job is not None:
            await asyncio.shield(self._job)


_WRITE_QUEUES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _WriteQueue] = (
    weakref.WeakKeyDictionary()
)


def format_epoch_entries(entries: Iterable[tuple[int, int]]) -> str:
    return _format(f"{epoch} {offset}" for epoch, offset in entries)


def kafka_uuid(value: uuid.UUID) -> str:
    """Kafka's `Uuid.toString()`: URL-safe base64 of the 16 bytes, unpadded (topic ids,
    segment ids, as Kafka's files, znodes and tools write them)."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


def parse_kafka_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def read_partition_metadata(path: Path) -> uuid.UUID | None:
    try:
        fields = dict(
            line.split(":", 1) for line in path.read_text(encoding="utf-8").splitlines() if line
        )
    except FileNotFoundError:
        return None
    return parse_kafka_uuid(fields["topic_id"].strip())


def write_partition_metadata(path: Path, topic_id: uuid.UUID) -> None:
    write_atomically(path, f"version: {VERSION}\ntopic_id: {kafka_uuid(topic_id)}\n")
