"""The classic consumer-group coordinator, as Apache Kafka runs it, seen through confluent-kafka
(librdkafka) and through raw wire requests (kio entities).

Covered: a group of three covering every offset of a topic written by an idempotent
producer while one member leaves; commits surviving a clean restart and a SIGKILL;
static membership; the admin views (ListGroups, DescribeGroups, DeleteGroups,
OffsetDelete, altering and listing offsets); and bad group requests.
"""

from __future__ import annotations

import datetime
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.leave_group.v4.request import LeaveGroupRequest, MemberIdentity
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_delete.v0.request import (
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
)
from kio.schema.sync_group.v5.request import SyncGroupRequest, SyncGroupRequestAssignment

from tests.integration.broker_process import BrokerProcess
from tests.integration.wire import WireClient
from tierbroker.protocol.errors import ErrorCode

PARTITIONS = 6
OFFSET_INVALID = -1001  # librdkafka: no committed offset


# Helpers -----------------------------------------------------------------------------


def wait_for(
    condition: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    every: Callable[[], object] | None = None,
) -> None:
    """Poll `condition` until it holds; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if every is not None:
            every()
        if condition():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        if every is None:
            time.sleep(0.05)


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    """The topic, and the group coordinator ready, as a client's first FindCoordinator
    leaves it (__consumer_offsets created and loaded): tests below join without one."""
    admin = admin_client(bootstrap)  # held: the future fails if its client is destroyed
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)
    admin.describe_consumer_groups(["coordinator-probe"])["coordinator-probe"].result(15)


def idempotent_producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "reconnect.backoff.max.ms": 500,
        }
    )


def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> None:
    producer = idempotent_producer(bootstrap)
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for i in range(start, start + count):
        while True:
            try:
                producer.produce(topic, b"v%d" % i, b"k%d" % i, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert errors == []


def group_consumer(bootstrap: str, group: str, **conf: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 500,
            "reconnect.backoff.max.ms": 500,
            **conf,
        }
    )


def end_offsets(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def committed_offsets(admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets as the broker lists them (OffsetFetch)."""
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(
        10
    )
    for tp in result.topic_partitions:
        assert tp.error is None, tp
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}


def describe(admin: AdminClient, group: str) -> Any:
    return admin.describe_consumer_groups([group])[group].result(10)


def partitions_of(tps: list[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in tps)


def assert_no_traceback(broker: BrokerProcess) -> None:
    """As the `broker` fixture checks: nothing the broker did raised unexpectedly."""
    log_text = broker.log()
    at = log_text.find("Traceback")
    assert at < 0, log_text[max(0, log_text.rfind("\n", 0, at - 1) - 200) : at + 2500]


def is_stable_with(admin: AdminClient, group: str, members: int) -> bool:
    d = describe(admin, group)
    return bool(d.state == ConsumerGroupState.STABLE and len(d.members) == members)


REBALANCED = (
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
)
RETRIABLE = (  # the coordinator is restarting or not yet found again
    KafkaError._WAIT_COORD,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
)


def consume_and_commit(
    consumer: Consumer, seen: set[tuple[int, int]], lock: threading.Lock | None = None
) -> int:
    """One batch: record (partition, offset) of each message, then commit exactly those
    offsets synchronously. Returns the number of messages. A commit refused because the
    generation moved on is left (the partition's next owner reads from the last commit);
    one that failed because the coordinator was away is retried."""
    messages = consumer.consume(1_000, 0.1)
    good = []
    for m in messages:
        if m.error() is None:
            good.append(m)
        else:
            assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
    if not good:
        return 0
    if lock is not None:
        with lock:
            seen.update((m.partition(), m.offset()) for m in good)
    else:
        seen.update((m.partition(), m.offset()) for m in good)
    next_offsets: dict[tuple[str, int], int] = {}
    for m in good:
        key = (m.topic(), m.partition())
        next_offsets[key] = max(next_offsets.get(key, 0), m.offset() + 1)
    offsets = [TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
    deadline = time.monotonic() + 20
    while True:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            break
        except KafkaException as e:
            code = e.args[0].code()
            if code in REBALANCED:
                break  # Kafka refuses a commit of a past generation; the new owner re-reads
            assert code in RETRIABLE and time.monotonic() < deadline, e
    return len(good)


# Raw wire helpers ---------------------------------------------------------------------

SESSION = datetime.timedelta(seconds=10)


def still_serving(port: int) -> None:
    with WireClient(port) as fresh:
        response = fresh.request(
            ApiVersionsRequest(client_software_name="test", client_software_version="1")
        )
        assert response.error_code == ErrorCode.none


def subscription(topics: Iterable[str], user_data: bytes | None = None) -> bytes:
    """ConsumerProtocolSubscription v0, as a consumer puts it in JoinGroup."""
    data = struct.pack(">h", 0)
    topics = list(topics)
    data += struct.pack(">i", len(topics))
    for t in topics:
        data += struct.pack(">h", len(t)) + t.encode()
    if user_data is None:
        data += struct.pack(">i", -1)
    else:
        data += struct.pack(">i", len(user_data)) + user_data
    return data


def join(
    client: WireClient,
    group: str,
    member_id: str = "",
    *,
    session: datetime.timedelta = SESSION,
    metadata: bytes | None = None,
    instance_id: str | None = None,
) -> Any:
    return client.request(
        JoinGroupRequest(
            group_id=group,
            session_timeout=session,
            rebalance_timeout=SESSION,
            member_id=member_id,
            group_instance_id=instance_id,
            protocol_type="consumer",
            protocols=(
                JoinGroupRequestProtocol(
                    name="range", metadata=subscription(["gt"]) if metadata is None else metadata
                ),
            ),
        )
    )


def sync(
    client: WireClient, group: str, generation: int, member_id: str, assignments: dict[str, bytes]
) -> Any:
    return client.request(
        SyncGroupRequest(
            group_id=group,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=tuple(
                SyncGroupRequestAssignment(member_id=m, assignment=a)
                for m, a in assignments.items()
            ),
        )
    )


def heartbeat(client: WireClient, group: str, generation: int, member_id: str) -> ErrorCode:
    return ErrorCode(
        client.request(
            HeartbeatRequest(
                group_id=group,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=None,
            )
        ).error_code
    )


def commit(
    client: WireClient,
    group: str,
    generation: int,
    member_id: str,
    offsets: dict[tuple[str, int], int],
) -> dict[tuple[str, int], ErrorCode]:
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append((partition, offset))
    response = client.request(
        OffsetCommitRequest(
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member_id,
            group_instance_id=None,
            topics=tuple(
                OffsetCommitRequestTopic(
                    name=topic,
                    partitions=tuple(
                        OffsetCommitRequestPartition(
                            partition_index=p,
                            committed_offset=o,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        )
                        for p, o in parts
                    ),
                )
                for topic, parts in by_topic.items()
            ),
        )
    )
    return {
        (t.name, p.partition_index): ErrorCode(p.error_code)
        for t in response.topics
        for p in t.partitions
    }


def leave(client: WireClient, group: str, member_id: str) -> Any:
    return client.request(
        LeaveGroupRequest(
            group_id=group, members=(MemberIdentity(member_id=member_id, group_instance_id=None),)
        )
    )


def offset_delete(client: WireClient, group: str, topic: str, partitions: Iterable[int]) -> Any:
    return client.request(
        OffsetDeleteRequest(
            group_id=group,
            topics=(
                OffsetDeleteRequestTopic(
                    name=topic,
                    partitions=tuple(
                        OffsetDeleteRequestPartition(partition_index=p) for p in partitions
                    ),
                ),
            ),
        )
    )


class WireMember:
    """A group member over its own connection, following the classic protocol."""

    def __init__(self, port: int, group: str, metadata: bytes | None = None) -> None:
        self.client = WireClient(port, timeout_s=30)
        self.group = group
        self.metadata = metadata
        self.member_id = ""
        self.generation = -1
        self.leader = False
        self.members: list[str] = []
        self.assignment = b""
        self.stable_generation: int | None = None

    def close(self) -> None:
        self.client.close()

    def join(self) -> ErrorCode:
        """JoinGroup, asking for a member id first if it has none (KIP-394)."""
        while True:
            r = join(self.client, self.group, self.member_id, metadata=self.metadata)
            if r.error_code == ErrorCode.member_id_required and not self.member_id:
                assert r.member_id, "MEMBER_ID_REQUIRED comes with the member id to use"
                self.member_id = r.member_id
                continue
            if r.error_code == ErrorCode.none:
                self.generation = r.generation_id
                self.leader = r.leader == self.member_id
                self.members = [m.member_id for m in r.members]
            return ErrorCode(r.error_code)

    def sync(self) -> ErrorCode:
        assignments = (
            {m: b"assignment-of-" + m.encode() for m in self.members} if self.leader else {}
        )
        r = sync(self.client, self.group, self.generation, self.member_id, assignments)
        if r.error_code == ErrorCode.none:
            self.assignment = r.assignment
        return ErrorCode(r.error_code)

    def heartbeat(self) -> ErrorCode:
        return heartbeat(self.client, self.group, self.generation, self.member_id)

    def run_until(self, done: threading.Event, deadline: float) -> None:
        """Join, sync and heartbeat as a consumer does, until `done`; rejoin when told to."""
        while not done.is_set() and time.monotonic() < deadline:
            self.stable_generation = None
            code = self.join()
            if code == ErrorCode.unknown_member_id:
                self.member_id = ""  # as clients do: join again as a new member
            if code != ErrorCode.none or self.sync() != ErrorCode.none:
                continue
            while not done.is_set() and self.heartbeat() == ErrorCode.none:
                self.stable_generation = self.generation
                done.wait(0.05)  # the heartbeat interval


def settle_all(members: list[WireMember], timeout_s: float = 30) -> None:
    """Run the members concurrently until they all heartbeat in one generation."""
    done = threading.Event()
    deadline = time.monotonic() + timeout_s
    for m in members:
        m.stable_generation = None
    threads = [threading.Thread(target=m.run_until, args=(done, deadline)) for m in members]
    for t in threads:
        t.start()
    try:
        wait_for(
            lambda: (
                len({m.stable_generation for m in members}) == 1
                and members[0].stable_generation is not None
            ),
            timeout_s,
            "the members to agree on a generation",
        )
    finally:
        done.set()
        for t in threads:
            t.join(30)
    assert all(m.heartbeat() == ErrorCode.none for m in members)


# 1. Coverage, a leaving member, commits, a clean restart ---------------------------------


def test_group_covers_every_offset_and_resumes_from_commits_after_restart(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path).start()
    admin = admin_client(broker.bootstrap)
    create_topic(broker.bootstrap, "orders")
    seen: set[tuple[int, int]] = set()
    lock = threading.Lock()
    stop = threading.Event()
    left = threading.Event()
    failures: list[BaseException] = []

    def member(name: str, leave_after: int | None) -> None:
        consumer = group_consumer(broker.bootstrap, "G", **{"client.id": name})
        try:
            consumer.subscribe(["orders"])
            handled = 0
            while not stop.is_set():
                handled += consume_and_commit(consumer, seen, lock)
                if leave_after is not None and handled >= leave_after:
                    break
        except BaseException as e:  # reported by the main thread
            failures.append(e)
        finally:
            consumer.close()  # a dynamic member sends LeaveGroup
            if leave_after is not None:
                left.set()

    threads = [
        threading.Thread(target=member, args=("leaver", 2_000), daemon=True),
        threading.Thread(target=member, args=("stayer-1", None), daemon=True),
        threading.Thread(target=member, args=("stayer-2", None), daemon=True),
    ]
    for t in threads:
        t.start()
    try:

        def three_members_assigned() -> bool:
            d = describe(admin, "G")
            return (
                d.state == ConsumerGroupState.STABLE
                and len(d.members) == 3
                and all(m.assignment.topic_partitions for m in d.members)
            )

        wait_for(three_members_assigned, 30, "three members, each with partitions")
        produce(broker.bootstrap, "orders", 30_000)
        wait_for(left.is_set, 60, "the leaving member to close midway")
        assert not failures, failures
        produce(broker.bootstrap, "orders", 30_000, start=30_000)
        ends = end_offsets(broker.bootstrap, "orders")
        assert sum(ends.values()) == 60_000
        expected = {(p, o) for p, end in ends.items() for o in range(end)}

        def covered_and_committed() -> bool:
            with lock:
                if not expected <= seen:
                    return False
            return committed_offsets(admin, "G") == {("orders", p): e for p, e in ends.items()}

        wait_for(covered_and_committed, 120, "every offset consumed and committed")
        assert not failures, failures
        with lock:
            assert seen == expected
        wait_for(lambda: is_stable_with(admin, "G", 2), 30, "G stable with the two stayers")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not failures, failures
    wait_for(lambda: describe(admin, "G").state == ConsumerGroupState.EMPTY, 30, "G empty")
    committed = committed_offsets(admin, "G")

    # A group deleted before the restart stays deleted after it.
    admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("gone", [TopicPartition("orders", 0, 7)])]
    )["gone"].result(10)
    admin.delete_consumer_groups(["gone"])["gone"].result(10)

    assert broker.stop(signal.SIGTERM) == 0
    broker = broker.restarted()
    admin = admin_client(broker.bootstrap)
    assert committed_offsets(admin, "G") == committed
    assert committed_offsets(admin, "gone") == {}
    assert "gone" not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}

    produce(broker.bootstrap, "orders", 600, start=60_000)
    consumer = group_consumer(broker.bootstrap, "G")
    consumer.subscribe(["orders"])
    first: dict[int, int] = {}
    after: set[tuple[int, int]] = set()
    try:

        def read_all_new() -> bool:
            for m in consumer.consume(1_000, 0.1):
                if m.error() is None:
                    first.setdefault(m.partition(), m.offset())
                    after.add((m.partition(), m.offset()))
            return len(after) >= 600

        wait_for(read_all_new, 60, "the 600 records written after the restart")
    finally:
        consumer.close()
    assert first == {p: committed[("orders", p)] for p in range(PARTITIONS)}, (
        "the new member did not resume exactly at the committed offsets"
    )
    assert min(o - committed[("orders", p)] for p, o in after) >= 0, "committed records re-read"
    broker.stop()
    assert_no_traceback(broker)


# 2. Static membership ---------------------------------------------------------------------


def test_static_member_returns_without_rebalancing_the_group(broker: BrokerProcess) -> None:
    admin = admin_client(broker.bootstrap)
    create_topic(broker.bootstrap, "static")
    events: list[tuple[str, str, list[int]]] = []

    def static_consumer(instance: str, session_ms: int = 10_000) -> Consumer:
        consumer = group_consumer(
            broker.bootstrap,
            "G-static",
            **{"group.instance.id": instance, "session.timeout.ms": session_ms},
        )
        consumer.subscribe(
            ["static"],
            on_assign=lambda c, ps: events.append((instance, "assign", partitions_of(ps))),
            on_revoke=lambda c, ps: events.append((instance, "revoke", partitions_of(ps))),
        )
        return consumer

    def latest(instance: str) -> list[int] | None:
        for who, kind, parts in reversed(events):
            if who == instance:
                return parts if kind == "assign" else None
        return None

    def member_of(instance: str) -> Any:
        [m] = [m for m in describe(admin, "G-static").members if m.group_instance_id == instance]
        return m

    # `stay` joins first and leads. A returning leader on JoinGroup < v9 (librdkafka's
    # version) makes Kafka rebalance, to let it assign; a returning follower does not.
    stay = static_consumer("stay")
    wait_for(
        lambda: latest("stay") == list(range(PARTITIONS)),
        30,
        "stay to get all partitions",
        every=lambda: stay.poll(0.1),
    )
    leaving = static_consumer("leaving", session_ms=6_000)
    back: Consumer | None = None
    try:

        def both_assigned() -> bool:
            leaving.poll(0.05)
            mine, theirs = latest("stay"), latest("leaving")
            return (
                mine is not None
                and theirs is not None
                and bool(theirs)
                and sorted(mine + theirs) == list(range(PARTITIONS))
                and is_stable_with(admin, "G-static", 2)
            )

        wait_for(both_assigned, 30, "both static members assigned", every=lambda: stay.poll(0.05))
        mine, theirs = latest("stay"), latest("leaving")
        old_member_id = member_of("leaving").member_id
        stay_events = [e for e in events if e[0] == "stay"]

        leaving.close()  # a static member does not send LeaveGroup (KIP-345)
        stay.poll(0.5)
        d = describe(admin, "G-static")
        assert d.state == ConsumerGroupState.STABLE
        assert {m.group_instance_id for m in d.members} == {"stay", "leaving"}

        mark = len(events)
        back = static_consumer("leaving", session_ms=6_000)
        returning = back

        def returned() -> bool:
            returning.poll(0.05)
            return any(e[0] == "leaving" for e in events[mark:])

        wait_for(returned, 20, "the returning member's assignment", every=lambda: stay.poll(0.05))
        assert [e for e in events[mark:] if e[0] == "leaving"] == [("leaving", "assign", theirs)]
        assert member_of("leaving").member_id != old_member_id
        # Let `stay` heartbeat through a few intervals: a rebalance would reach it now.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            stay.poll(0.1)
            back.poll(0.1)
        assert [e for e in events if e[0] == "stay"] == stay_events, (
            "the other member was rebalanced"
        )
        assert latest("stay") == mine
        d = describe(admin, "G-static")
        assert d.state == ConsumerGroupState.STABLE and len(d.members) == 2
        assert (
            sorted(tp.partition for tp in member_of("leaving").assignment.topic_partitions)
            == theirs
        )

        # A static member that stays away past its session timeout is removed, and the
        # group rebalances: `stay` gets every partition again.
        back.close()
        back = None
        wait_for(
            lambda: latest("stay") == list(range(PARTITIONS)),
            30,
            "the group to rebalance after the static member's session expired",
            every=lambda: stay.poll(0.1),
        )
        assert [m.group_instance_id for m in describe(admin, "G-static").members] == ["stay"]
    finally:
        if back is not None:
            back.close()
        stay.close()


# 3. Admin views ----------------------------------------------------------------------------


def test_list_describe_delete_groups_and_offsets(broker: BrokerProcess) -> None:
    admin = admin_client(broker.bootstrap)
    create_topic(broker.bootstrap, "adm")
    produce(broker.bootstrap, "adm", 600)
    ends = end_offsets(broker.bootstrap, "adm")
    members = [
        group_consumer(broker.bootstrap, "G-adm", **{"client.id": f"c{i}"}) for i in range(2)
    ]
    seen: set[tuple[int, int]] = set()
    try:
        for c in members:
            c.subscribe(["adm"])

        def all_read_and_committed() -> bool:
            for c in members:
                consume_and_commit(c, seen)
            return (
                len(seen) == 600
                and is_stable_with(admin, "G-adm", 2)
                and committed_offsets(admin, "G-adm") == {("adm", p): e for p, e in ends.items()}
            )

        wait_for(all_read_and_committed, 60, "both members stable, everything read and committed")

        listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
        assert listed["G-adm"].state == ConsumerGroupState.STABLE
        assert not listed["G-adm"].is_simple_consumer_group
        stable_only = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(10)
        assert "G-adm" in {g.group_id for g in stable_only.valid}
        empty_only = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(10)
        assert "G-adm" not in {g.group_id for g in empty_only.valid}

        d = describe(admin, "G-adm")
        assert d.state == ConsumerGroupState.STABLE
        assert d.partition_assignor in ("range", "roundrobin")
        assert {m.client_id for m in d.members} == {"c0", "c1"}
        assigned = [tp.partition for m in d.members for tp in m.assignment.topic_partitions]
        assert sorted(assigned) == list(range(PARTITIONS)), (
            "members' assignments partition the topic"
        )
        assert all(m.assignment.topic_partitions for m in d.members)

        # DeleteGroups of an active group: NON_EMPTY_GROUP.
        with pytest.raises(KafkaException) as refused:
            admin.delete_consumer_groups(["G-adm"])["G-adm"].result(10)
        assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
        # Altering the offsets of an active group from outside it: UNKNOWN_MEMBER_ID.
        altered = admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("G-adm", [TopicPartition("adm", 0, 1)])]
        )["G-adm"]
        try:
            errors = [tp.error for tp in altered.result(10).topic_partitions]
        except KafkaException as e:
            errors = [e.args[0]]
        assert [e.code() if e else None for e in errors] == [KafkaError.UNKNOWN_MEMBER_ID]
        # OffsetDelete of a topic the active group subscribes to: GROUP_SUBSCRIBED_TO_TOPIC.
        with WireClient(broker.port) as client:
            r = offset_delete(client, "G-adm", "adm", [0, 1])
            assert r.error_code == ErrorCode.none
            assert [p.error_code for p in r.topics[0].partitions] == [
                ErrorCode.group_subscribed_to_topic
            ] * 2
        assert committed_offsets(admin, "G-adm")[("adm", 0)] == ends[0]
    finally:
        for c in members:
            c.close()
    still_serving(broker.port)

    wait_for(lambda: describe(admin, "G-adm").state == ConsumerGroupState.EMPTY, 30, "G-adm empty")
    assert describe(admin, "G-adm").members == []
    assert committed_offsets(admin, "G-adm") == {("adm", p): e for p, e in ends.items()}

    # An empty group's offsets can be altered and deleted.
    result = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("G-adm", [TopicPartition("adm", 0, 5)])]
    )["G-adm"].result(10)
    assert [(tp.partition, tp.offset, tp.error) for tp in result.topic_partitions] == [(0, 5, None)]
    assert committed_offsets(admin, "G-adm")[("adm", 0)] == 5
    with WireClient(broker.port) as client:
        r = offset_delete(client, "G-adm", "adm", [1, 2])
        assert r.error_code == ErrorCode.none
        assert [p.error_code for p in r.topics[0].partitions] == [ErrorCode.none] * 2
        missing = offset_delete(client, "no-such-group", "adm", [0])
        assert missing.error_code == ErrorCode.group_id_not_found
    still_serving(broker.port)
    remaining = committed_offsets(admin, "G-adm")
    assert set(remaining) == {("adm", p) for p in (0, 3, 4, 5)}
    explicit = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("G-adm", [TopicPartition("adm", 1)])]
    )["G-adm"].result(10)
    assert [tp.offset for tp in explicit.topic_partitions] == [OFFSET_INVALID]

    # DeleteGroups of the empty group: gone, offsets too; a second delete finds nothing.
    admin.delete_consumer_groups(["G-adm"])["G-adm"].result(10)
    assert "G-adm" not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    assert committed_offsets(admin, "G-adm") == {}
    with pytest.raises(KafkaException) as again:
        admin.delete_consumer_groups(["G-adm"])["G-adm"].result(10)
    assert again.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND
    with WireClient(broker.port) as client:
        [dead] = client.request(
            DescribeGroupsRequest(groups=("G-adm",), include_authorized_operations=False)
        ).groups
        assert dead.group_state == "Dead" and dead.members == ()
    # A consumer joining the deleted group's name starts from auto.offset.reset.
    fresh = group_consumer(broker.bootstrap, "G-adm")
    fresh.subscribe(["adm"])
    try:
        firsts: dict[int, int] = {}

        def first_of_each() -> bool:
            for m in fresh.consume(1_000, 0.1):
                if m.error() is None:
                    firsts.setdefault(m.partition(), m.offset())
            return len(firsts) == PARTITIONS

        wait_for(first_of_each, 30, "a fresh member to read every partition")
        assert firsts == dict.fromkeys(range(PARTITIONS), 0)
    finally:
        fresh.close()


# 4. SIGKILL in the middle of a group's life -------------------------------------------------


def test_group_survives_sigkill_with_commits_intact(
    broker_factory: type[BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(tmp_path).start()
    admin = admin_client(broker.bootstrap)
    create_topic(broker.bootstrap, "kill")
    produce(broker.bootstrap, "kill", 3_000)
    ends = end_offsets(broker.bootstrap, "kill")
    members = [group_consumer(broker.bootstrap, "G-kill") for _ in range(2)]
    seen: set[tuple[int, int]] = set()
    try:
        for c in members:
            c.subscribe(["kill"])

        def all_read_and_committed() -> bool:
            for c in members:
                consume_and_commit(c, seen)
            return committed_offsets(admin, "G-kill") == {
                ("kill", p): e for p, e in ends.items()
            } and is_stable_with(admin, "G-kill", 2)

        wait_for(all_read_and_committed, 60, "the group to read and commit everything")
        before = committed_offsets(admin, "G-kill")

        broker.stop(signal.SIGKILL)
        broker = broker.restarted()
        admin = admin_client(broker.bootstrap)
        assert committed_offsets(admin, "G-kill") == before

        produce(broker.bootstrap, "kill", 600, start=3_000)
        new_ends = end_offsets(broker.bootstrap, "kill")
        after: set[tuple[int, int]] = set()
        new_offsets = {(p, o) for p in range(PARTITIONS) for o in range(ends[p], new_ends[p])}

        def carried_on() -> bool:
            for c in members:
                consume_and_commit(c, after)
            return new_offsets <= after and committed_offsets(admin, "G-kill") == {
                ("kill", p): e for p, e in new_ends.items()
            }

        wait_for(carried_on, 60, "the members to carry on after the restart")
        assert after == new_offsets, "records committed before the crash were read again"
        wait_for(lambda: is_stable_with(admin, "G-kill", 2), 30, "G-kill stable with both members")
        parts = [tp.partition for c in members for tp in c.assignment()]
        assert sorted(parts) == list(range(PARTITIONS))
    finally:
        for c in members:
            c.close()
    broker.stop()
    assert_no_traceback(broker)


# 5. Bad input ---------------------------------------------------------------------------------


def test_bad_group_requests_get_kafkas_errors(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "gt", partitions=2)
    with WireClient(broker.port) as client:
        # Session timeouts outside group.min/max.session.timeout.ms (6 s, 30 min).
        for absurd in (datetime.timedelta(milliseconds=1), datetime.timedelta(hours=1)):
            r = join(client, "G-bad", session=absurd)
            assert r.error_code == ErrorCode.invalid_session_timeout
            still_serving(broker.port)
        # JoinGroup v4+ without a member id: MEMBER_ID_REQUIRED, with the id to use.
        r = join(client, "G-bad")
        assert r.error_code == ErrorCode.member_id_required
        assert r.member_id and r.generation_id == -1
        given = r.member_id
        r = join(client, "G-bad", given)
        assert r.error_code == ErrorCode.none
        assert (r.member_id, r.leader) == (given, given)
        assert [m.member_id for m in r.members] == [given]
        assert r.members[0].metadata == subscription(["gt"])
        still_serving(broker.port)
        # It leaves, so the members below need not wait out its rebalance timeout.
        left = leave(client, "G-bad", given)
        assert left.error_code == ErrorCode.none
        assert [(m.member_id, m.error_code) for m in left.members] == [(given, ErrorCode.none)]

    a, b = WireMember(broker.port, "G-bad"), WireMember(broker.port, "G-bad")
    try:
        settle_all([a, b])
        assert [a.leader, b.leader].count(True) == 1, "one leader per generation"
        for m in (a, b):  # each got what the leader assigned it
            assert m.assignment == b"assignment-of-" + m.member_id.encode()
        generation = a.generation
        c = a.client

        assert heartbeat(c, "G-bad", generation, "nobody") == ErrorCode.unknown_member_id
        still_serving(broker.port)
        assert sync(c, "G-bad", generation, "nobody", {}).error_code == ErrorCode.unknown_member_id
        still_serving(broker.port)
        assert heartbeat(c, "G-bad", generation - 1, a.member_id) == ErrorCode.illegal_generation
        still_serving(broker.port)
        assert heartbeat(c, "G-bad", generation + 1, a.member_id) == ErrorCode.illegal_generation
        still_serving(broker.port)
        assert sync(c, "G-bad", generation - 1, a.member_id, {}).error_code == (
            ErrorCode.illegal_generation
        )
        still_serving(broker.port)
        stale = commit(c, "G-bad", generation - 1, a.member_id, {("gt", 0): 1})
        assert stale == {("gt", 0): ErrorCode.illegal_generation}
        unknown = commit(c, "G-bad", generation, "nobody", {("gt", 0): 1})
        assert unknown == {("gt", 0): ErrorCode.unknown_member_id}
        still_serving(broker.port)

        # A commit naming partitions that do not exist fails for those partitions only.
        mixed = commit(
            c,
            "G-bad",
            generation,
            a.member_id,
            {("gt", 0): 5, ("gt", 1): 6, ("gt", 9): 7, ("no-such-topic", 0): 8},
        )
        assert mixed == {
            ("gt", 0): ErrorCode.none,
            ("gt", 1): ErrorCode.none,
            ("gt", 9): ErrorCode.unknown_topic_or_partition,
            ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition,
        }
        still_serving(broker.port)
        assert committed_offsets(admin_client(broker.bootstrap), "G-bad") == {
            ("gt", 0): 5,
            ("gt", 1): 6,
        }
        # The group is untouched by all of it.
        assert a.heartbeat() == ErrorCode.none and b.heartbeat() == ErrorCode.none
        assert a.generation == generation
    finally:
        a.close()
        b.close()


def test_oversized_join_metadata_leaves_the_group_working(broker: BrokerProcess) -> None:
    """2 MB of subscription user data (under socket.request.max.bytes): Kafka accepts the
    JoinGroup; storing such a generation exceeds __consumer_offsets' max.message.bytes, so
    its SyncGroup may fail. Either way the broker goes on serving, and once the big member
    leaves, the others form a working generation again."""
    create_topic(broker.bootstrap, "gt", partitions=2)
    a, b = WireMember(broker.port, "G-big"), WireMember(broker.port, "G-big")
    big = WireMember(broker.port, "G-big", metadata=subscription(["gt"], b"u" * 2_000_000))
    try:
        settle_all([a, b])
        generation = a.generation
        leader_sync: ErrorCode | None = None
        with ThreadPoolExecutor(3) as pool:
            joined = pool.submit(big.join)
            # The others learn of the rebalance from their heartbeats and join again.
            wait_for(lambda: a.heartbeat() == ErrorCode.rebalance_in_progress, 20, "a rebalance")
            rejoins = [pool.submit(m.join) for m in (a, b)]
            codes = [f.result(30) for f in [joined, *rejoins]]
            still_serving(broker.port)
            if codes == [ErrorCode.none] * 3:
                assert big.generation == a.generation == b.generation == generation + 1
                leader = next(m for m in (a, b, big) if m.leader)
                assert sorted(leader.members) == sorted(m.member_id for m in (a, b, big))
                syncs = {m.member_id: pool.submit(m.sync) for m in (a, b, big)}
                sync_codes = {mid: f.result(30) for mid, f in syncs.items()}
                leader_sync = sync_codes[leader.member_id]
                # Followers get the leader's outcome, or REBALANCE_IN_PROGRESS if they came
                # after a failed store had already sent the group back to rebalancing.
                for code in sync_codes.values():
                    assert code in (leader_sync, ErrorCode.rebalance_in_progress), sync_codes
            else:
                assert codes[0] != ErrorCode.none, codes
        still_serving(broker.port)
        r = leave(big.client, "G-big", big.member_id)
        assert r.error_code == ErrorCode.none
        assert [m.error_code for m in r.members] == [ErrorCode.none]
        settle_all([a, b])
        assert a.generation == b.generation > generation
        assert sorted([a.assignment, b.assignment]) == sorted(
            b"assignment-of-" + m.member_id.encode() for m in (a, b)
        )
        assert commit(a.client, "G-big", a.generation, a.member_id, {("gt", 0): 3}) == {
            ("gt", 0): ErrorCode.none
        }
        # Kafka: a group metadata record over max.message.bytes fails the store with
        # MESSAGE_TOO_LARGE, which SyncGroup answers as UNKNOWN_SERVER_ERROR
        # (GroupMetadataManager.storeGroup; appendGroupMetadataErrorToResponseError).
        assert leader_sync in (None, ErrorCode.none, ErrorCode.unknown_server_error), leader_sync
    finally:
        for m in (a, b, big):
            m.close()
    still_serving(broker.port)
