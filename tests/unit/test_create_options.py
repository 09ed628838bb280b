"""tierbroker's own CreateTopics entries: a given topic id and first leader epoch."""

from __future__ import annotations

import uuid

import pytest

from tierbroker.broker.metadata.create_options import (
    CREATE_FIRST_LEADER_EPOCH,
    CREATE_TOPIC_ID,
    CreateOptions,
    split_create_options,
)
from tierbroker.broker.metadata.zk_data import TopicAssignment
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.checkpoints import kafka_uuid


def test_the_options_leave_the_configs_and_parse() -> None:
    topic_id = uuid.uuid4()
    configs, options = split_create_options(
        {CREATE_TOPIC_ID: kafka_uuid(topic_id), CREATE_FIRST_LEADER_EPOCH: "7", "retention.ms": "1"}
    )
    assert configs == {"retention.ms": "1"}
    assert options == CreateOptions(topic_id=topic_id, first_leader_epoch=7)
    assert split_create_options({"a": "b"}) == ({"a": "b"}, CreateOptions())


@pytest.mark.parametrize(
    "configs",
    [
        {CREATE_TOPIC_ID: "not an id"},
        {CREATE_TOPIC_ID: kafka_uuid(uuid.UUID(int=0))},
        {CREATE_FIRST_LEADER_EPOCH: "-1"},
        {CREATE_FIRST_LEADER_EPOCH: "x"},
    ],
)
def test_a_bad_option_is_invalid_config_naming_it(configs: dict[str, str]) -> None:
    with pytest.raises(KafkaError, match=next(iter(configs))) as raised:
        split_create_options(configs)
    assert raised.value.code == ErrorCode.invalid_config


def test_the_topic_znode_carries_a_first_leader_epoch_only_when_there_is_one() -> None:
    plain = TopicAssignment(uuid.uuid4(), {0: (1, 2)})
    restored = TopicAssignment(uuid.uuid4(), {0: (1, 2)}, first_leader_epoch=5)
    assert b"first_leader_epoch" not in plain.encode()
    assert TopicAssignment.decode(plain.encode()) == plain
    assert TopicAssignment.decode(restored.encode()) == restored
