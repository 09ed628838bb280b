"""Kafka Streams' word count (tests/java/WordCount.java) against tierbroker, as against
Apache Kafka.

The count's state store logs its updates to a changelog topic, which Streams creates
as it does by default, with cleanup.policy=compact; both brokers describe it so. The
program runs twice over the input, wiping its local state in between and waiting for
the broker's cleaner to have been through the changelog, so the second half is
counted on counts restored from a cleaned changelog. With `exactly_once_v2` each
commit is a transaction (KIP-447: one producer per thread, its offsets fenced by the
group's generation): tierbroker answers with transactions v1, Apache Kafka 4 with v2.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.apache_kafka import run_java
from tests.integration.test_compaction import clean_often

VOCABULARY = "the quick brown fox jumps over lazy dog tiered log segment broker stream".split()


def lines() -> list[str]:
    """Lines of words with punctuation and mixed case, each word a different number of times."""
    return [
        f"{VOCABULARY[i % 13].title()}, {' '.join(VOCABULARY[: i % 7 + 1])}: {VOCABULARY[i % 11]}!"
        for i in range(300)
    ]


def word_count(
    bootstrap: str, directory: Path, guarantee: str
) -> tuple[dict[str, str], dict[str, int]]:
    """Run the word count; the changelog topic's configs and the final counts."""
    topic = f"words-{uuid.uuid4().hex[:8]}"
    (directory / "lines.txt").write_text("\n".join(lines()) + "\n")
    output = run_java(
        "WordCount.java",
        bootstrap,
        topic,
        f"{topic}-counts",
        str(directory / "lines.txt"),
        str(directory / "state"),
        guarantee,
    )
    parsed = [line.split(maxsplit=2) for line in output.splitlines()]
    configs = {name: value for kind, name, value in parsed if kind == "changelog"}
    return configs, {word: int(n) for kind, word, n in parsed if kind == "count"}


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_word_count_restores_its_store_from_a_compacted_changelog(
    kafka_broker: str, tmp_path: Path, request: pytest.FixtureRequest, guarantee: str
) -> None:
    if request.node.callspec.params["kafka_broker"] == "apache-kafka":
        clean_often(kafka_broker)
    configs, counts = word_count(kafka_broker, tmp_path, guarantee)
    assert configs.pop("cleanup.policy") == "compact"
    records, end = map(int, configs.pop("cleaned").split())
    assert records < end  # restored from a changelog the cleaner had been through
    words = (w for line in lines() for w in re.split(r"\W+", line.lower(), flags=re.ASCII))
    assert counts == Counter(w for w in words if w)
