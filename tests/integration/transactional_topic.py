"""A tiered topic of committed and aborted transactions, for the read_committed readers.

Twelve transactions of ten records in 4 KiB segments, every third aborted, then one more
left open while its segment rolls (so its segment is not copied), then aborted. Once
tiered, the remote tier ends past that transaction's first offset, but the producer
snapshot of the segment holding it says it was open, and its ABORT marker is local only.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.broker_process import BrokerProcess
from tests.integration.tiering_helpers import status
from tests.integration.waiting import wait_for

TIMEOUT_S = 30.0
CONFIG = {"remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.bytes": "4096"}


@dataclass(frozen=True)
class TransactionalTopic:
    name: str
    committed: list[bytes]  # the values of the committed transactions, in order
    open_at: int  # the first offset of the transaction open when its segment rolled
    storage: str  # file:// URL of the broker's remote tier


def transactional_topic(broker: BrokerProcess, name: str) -> TransactionalTopic:
    """The topic above on `broker`, its last transaction aborted and copied."""
    topic = start_transactional_topic(broker, name)
    topic.producer.abort_transaction(TIMEOUT_S)
    wait_for(
        lambda: status(broker, name)["remote_log_end_offset"] >= topic.done.open_at,
        "the copy past the aborted transaction",
        show=lambda: status(broker, name),
    )
    return topic.done


@dataclass(frozen=True)
class Started:
    done: TransactionalTopic
    producer: Producer


def start_transactional_topic(broker: BrokerProcess, name: str) -> Started:
    """The topic with its last transaction still open, most of it tiered already."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=CONFIG)])[name].result(TIMEOUT_S)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{name}"})
    p.init_transactions(TIMEOUT_S)
    committed = []
    for round_ in range(12):
        p.begin_transaction()
        for i in range(10):
            value = b"r%02d-%02d-" % (round_, i) + b"x" * 100
            p.produce(name, value)
            if round_ % 3 != 1:
                committed.append(value)
        p.flush(TIMEOUT_S)
        if round_ % 3 == 1:
            p.abort_transaction(TIMEOUT_S)
        else:
            p.commit_transaction(TIMEOUT_S)
    p.begin_transaction()
    p.produce(name, b"undecided" + b"x" * 4096)
    p.flush(TIMEOUT_S)
    open_at = status(broker, name)["log_end_offset"] - 1
    p.produce(name, b"more" + b"x" * 4096)  # rolls the segment holding the open data
    p.flush(TIMEOUT_S)
    wait_for(
        lambda: status(broker, name)["local_log_start_offset"] > 60,
        "most of the topic in the remote tier only",
        show=lambda: status(broker, name),
    )
    storage = (broker.data_dir / "logs" / "remote").as_uri()
    return Started(TransactionalTopic(name, committed, open_at, storage), p)
