"""Kafka Streams' word count (tests/java/WordCount.java) against tierbroker, as against
Apache Kafka.

The count's state store logs its updates to a changelog topic, which Streams creates
with cleanup.policy=compact. tierbroker does not compact yet and refuses that with
INVALID_CONFIG instead of keeping the promise silently; the application runs on
tierbroker with the changelog Kafka also accepts and tierbroker honours: delete with
retention.ms=-1, every update kept (`keep`). The program runs twice over the input,
wiping its local state in between, so the second half is counted on counts restored
from the changelog. `exactly_once_v2` waits for transactions, `compact` for compaction.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.apache_kafka import run_java
from tierbroker.testing import TierbrokerCluster

VOCABULARY = "the quick brown fox jumps over lazy dog tiered log segment broker stream".split()


def lines() -> list[str]:
    """Lines of words with punctuation and mixed case, each word a different number of times."""
    return [
        f"{VOCABULARY[i % 13].title()}, {' '.join(VOCABULARY[: i % 7 + 1])}: {VOCABULARY[i % 11]}!"
        for i in range(300)
    ]


def word_count(
    bootstrap: str, directory: Path, guarantee: str, changelog: str
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
        changelog,
    )
    parsed = [line.split() for line in output.splitlines()]
    configs = {name: value for kind, name, value in parsed if kind == "changelog"}
    return configs, {word: int(n) for kind, word, n in parsed if kind == "count"}


def test_word_count_with_a_state_store_at_least_once(kafka_broker: str, tmp_path: Path) -> None:
    configs, counts = word_count(kafka_broker, tmp_path, "at_least_once", "keep")
    assert configs == {"cleanup.policy": "delete", "retention.ms": "-1"}
    words = (w for line in lines() for w in re.split(r"\W+", line.lower(), flags=re.ASCII))
    assert counts == Counter(w for w in words if w)


def test_a_compacted_changelog_is_refused_not_silently_kept(
    shared_tierbroker: TierbrokerCluster, tmp_path: Path
) -> None:
    """Streams' default changelog: Streams stops at once with tierbroker's reason."""
    refused = "InvalidConfigurationException: cleanup.policy='compact': compaction is not"
    with pytest.raises(AssertionError, match=refused):
        word_count(shared_tierbroker.bootstrap_servers, tmp_path, "at_least_once", "compact")
