"""Bad group requests get Kafka's error codes, and the group and the broker keep working."""

from __future__ import annotations

import datetime

from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.heartbeat.v3.request import HeartbeatRequest
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.sync_group.v3.request import SyncGroupRequest, SyncGroupRequestAssignment

from protocol.errors import ErrorCode
from tests.integration.broker_process import BrokerProcess
from tests.integration.wire import WireClient

SESSION = datetime.timedelta(seconds=10)


def join(
    client: WireClient,
    group: str,
    member_id: str = "",
    session: datetime.timedelta = SESSION,
    metadata: bytes = b"\x00\x01meta",
) -> object:
    return client.request(
        JoinGroupRequest(
            group_id=group,
            session_timeout=session,
            rebalance_timeout=SESSION,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=metadata),),
        )
    )


def still_serving(broker: BrokerProcess) -> bool:
    with WireClient(broker.port) as fresh:
        response = fresh.request(
            ApiVersionsRequest(client_software_name="t", client_software_version="1")
        )
        return bool(response.error_code == ErrorCode.none)


def joined_member(client: WireClient, group: str) -> tuple[str, int]:
    """KIP-394: the first join asks for a member id; joining with it completes the rebalance."""
    first = join(client, group)
    assert first.error_code == ErrorCode.member_id_required and first.member_id  # type: ignore[attr-defined]
    second = join(client, group, first.member_id)  # type: ignore[attr-defined]
    assert second.error_code == ErrorCode.none  # type: ignore[attr-defined]
    return second.member_id, second.generation_id  # type: ignore[attr-defined]


def test_group_errors(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("gt", 2, 1)])["gt"].result(15)
    with WireClient(broker.port) as client:
        for absurd in (datetime.timedelta(milliseconds=1), datetime.timedelta(hours=1)):
            assert join(client, "g", session=absurd).error_code == ErrorCode.invalid_session_timeout  # type: ignore[attr-defined]
        member, generation = joined_member(client, "g")
        sync = client.request(
            SyncGroupRequest(
                group_id="g",
                generation_id=generation,
                member_id=member,
                group_instance_id=None,
                assignments=(SyncGroupRequestAssignment(member_id=member, assignment=b"\x00\x00"),),
            )
        )
        assert sync.error_code == ErrorCode.none and sync.assignment == b"\x00\x00"

        def heartbeat(member_id: str, gen: int) -> ErrorCode:
            return client.request(
                HeartbeatRequest(
                    group_id="g", generation_id=gen, member_id=member_id, group_instance_id=None
                )
            ).error_code

        assert heartbeat("nobody", generation) == ErrorCode.unknown_member_id
        assert heartbeat(member, generation - 1) == ErrorCode.illegal_generation
        stale_sync = client.request(
            SyncGroupRequest(
                group_id="g",
                generation_id=generation + 5,
                member_id=member,
                group_instance_id=None,
                assignments=(),
            )
        )
        assert stale_sync.error_code == ErrorCode.illegal_generation
        commit = client.request(
            OffsetCommitRequest(
                group_id="g",
                generation_id_or_member_epoch=generation,
                member_id=member,
                group_instance_id=None,
                topics=(
                    OffsetCommitRequestTopic(
                        name="gt",
                        partitions=(
                            OffsetCommitRequestPartition(
                                partition_index=0,
                                committed_offset=5,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            ),
                            OffsetCommitRequestPartition(
                                partition_index=9,
                                committed_offset=5,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            ),
                        ),
                    ),
                    OffsetCommitRequestTopic(
                        name="no-such-topic",
                        partitions=(
                            OffsetCommitRequestPartition(
                                partition_index=0,
                                committed_offset=1,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            ),
                        ),
                    ),
                ),
            )
        )
        codes = [p.error_code for t in commit.topics for p in t.partitions]
        assert codes == [
            ErrorCode.none,
            ErrorCode.unknown_topic_or_partition,
            ErrorCode.unknown_topic_or_partition,
        ]
        # Oversized protocol metadata (2 MB, under socket.request.max.bytes): the broker copes.
        big = join(client, "g-big", metadata=b"\x00\x01" + b"m" * 2_000_000)
        assert big.error_code in (ErrorCode.member_id_required, ErrorCode.none)  # type: ignore[attr-defined]
        # The group still works for its member.
        assert heartbeat(member, generation) == ErrorCode.none
    assert still_serving(broker)
