"""A Quix Streams application for tests/integration/test_quix_streams.py: counts the records
of each key of the input topic, exactly once, in its RocksDB store (logged to a changelog
topic Quix creates), and writes each running count, `{"count": n}` keyed by the input's
key, to the output topic. Runs until SIGTERM.

    python quix_count_app.py BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID STATE_DIR
"""

from __future__ import annotations

import sys
from typing import Any

from quixstreams import Application, State


def count(_value: Any, state: State[Any, Any]) -> dict[str, int]:
    n = int(state.get("count", 0)) + 1
    state.set("count", n)
    return {"count": n}


def main(bootstrap: str, source: str, sink: str, group: str, txn_id: str, state: str) -> None:
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=0.5,
        state_dir=state,
        producer_extra_config={"transactional.id": txn_id},
        # A crashed instance leaves the group in seconds, not the default 45; yet a live one
        # outlasts a coordinator's failover on a loaded machine (Quix exits on a commit
        # refused for a lost membership).
        consumer_extra_config={"session.timeout.ms": 20_000},
        loglevel="INFO",
    )
    words = app.topic(source, key_deserializer="str", value_deserializer="str")
    counts = app.topic(sink, key_serializer="str", value_serializer="json")
    app.dataframe(words).apply(count, stateful=True).to_topic(counts)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:7])
