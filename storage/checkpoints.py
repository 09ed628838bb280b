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

import base64
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from tierbroker.storage.file_io import replace_durably, write_file
from tierbroker.storage.topic_partition import TopicPartition

VERSION = 0


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
    write_atomically(path, _format(f"{epoch} {offset}" for epoch, offset in entries))


def topic_id_to_str(topic_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def topic_id_from_str(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def read_partition_metadata(path: Path) -> uuid.UUID | None:
    try:
        fields = dict(
            line.split(":", 1) for line in path.read_text(encoding="utf-8").splitlines() if line
        )
    except FileNotFoundError:
        return None
    return topic_id_from_str(fields["topic_id"].strip())


def write_partition_metadata(path: Path, topic_id: uuid.UUID) -> None:
    write_atomically(path, f"version: {VERSION}\ntopic_id: {topic_id_to_str(topic_id)}\n")
