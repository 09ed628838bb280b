"""`CreateOptions`: tierbroker's own entries in a CreateTopics request's configs.

Kafka cannot create a topic with a given id: a new topic always gets a new one. A topic
restored from its remote tier needs its old id (the remote tier's keys and metadata
name it) and leader epochs above those of its history (a leader's epoch must exceed
every epoch of the log it continues). Two entries of the request's configs ask for
them; they are taken out before the configs are checked and never stored:

- `tierbroker.create.topic.id`: the topic's id, in Kafka's base64 form; refused
  (TOPIC_ALREADY_EXISTS) if a topic has that id;
- `tierbroker.create.first.leader.epoch`: the leader epoch its partitions start in
  (default 0).

`tierbroker remote restore` sends them; a stock client can too (configs are free text).
"""

from __future__ import annotations

import binascii
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.checkpoints import parse_kafka_uuid

CREATE_TOPIC_ID = "tierbroker.create.topic.id"
CREATE_FIRST_LEADER_EPOCH = "tierbroker.create.first.leader.epoch"


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateOptions:
    topic_id: uuid.UUID | None = None  # None: a new random id, as Kafka
    first_leader_epoch: int = 0


NO_OPTIONS = CreateOptions()


def split_create_options(configs: Mapping[str, str]) -> tuple[dict[str, str], CreateOptions]:
    """The topic's own configs, and the create options among them; INVALID_CONFIG for a
    value that does not parse."""
    options = (CREATE_TOPIC_ID, CREATE_FIRST_LEADER_EPOCH)
    rest = {k: v for k, v in configs.items() if k not in options}
    topic_id = None
    if (text := configs.get(CREATE_TOPIC_ID)) is not None:
        try:
            topic_id = parse_kafka_uuid(text)
        except (ValueError, binascii.Error):
            raise KafkaError(
                ErrorCode.invalid_config, f"{CREATE_TOPIC_ID}={text!r} is not a topic id"
            ) from None
        if topic_id.int == 0:
            raise KafkaError(ErrorCode.invalid_config, f"{CREATE_TOPIC_ID} may not be the zero id")
    epoch_text = configs.get(CREATE_FIRST_LEADER_EPOCH, "0")
    try:
        epoch = int(epoch_text)
    except ValueError:
        epoch = -1
    if not 0 <= epoch < 2**31:
        raise KafkaError(
            ErrorCode.invalid_config,
            f"{CREATE_FIRST_LEADER_EPOCH}={epoch_text!r} is not a leader epoch (0 or more)",
        )
    return rest, CreateOptions(topic_id=topic_id, first_leader_epoch=epoch)
