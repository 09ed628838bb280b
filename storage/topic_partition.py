"""`TopicPartition`: the name of a partition, and its directory name."""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @classmethod
    def from_dir_name(cls, name: str) -> TopicPartition:
        """Parse `<topic>-<partition>`; topic names may themselves contain dashes."""
        topic, sep, partition = name.rpartition("-")
        if not sep or not topic or not partition.isdigit():
            raise ValueError(f"not a partition directory name: {name!r}")
        return cls(topic, int(partition))
