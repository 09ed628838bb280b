"""Kafka's Java client against tierbroker, as against Apache Kafka (tests/java): one broker
and three (racks a, b, c). Each test runs one Java program against tierbroker and against
Apache Kafka and asserts both print the same results, and the results expected."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from tests.apache_kafka import run_java
from tests.integration.broker_process import BrokerProcess

# A result's name; the client's own log lines start with a time or a class name.
RESULT = re.compile(r"([a-z][a-z0-9_.]*) (.+)")


def results(output: str) -> dict[str, str]:
    """The program's "name value" lines."""
    found = (RESULT.fullmatch(line) for line in output.splitlines())
    return {m[1]: m[2] for m in found if m is not None}


def both(request: pytest.FixtureRequest, kind: str, program: str, *args: str) -> dict[str, str]:
    """Run `program` against tierbroker and Apache Kafka of `kind` ("single" or "cluster"),
    assert both print the same, and return what they print."""
    suffix = "" if kind == "single" else "_cluster"
    printed = {}
    for broker in ("shared_tierbroker", "apache_kafka"):
        bootstrap = request.getfixturevalue(broker + suffix).bootstrap_servers
        printed[broker] = results(run_java(program, bootstrap, *args))
    assert printed["shared_tierbroker"] == printed["apache_kafka"]
    return printed["apache_kafka"]


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_the_idempotent_producer_and_a_group_consumer_see_every_record(kafka_broker: str) -> None:
    topic = unique("java")
    output = run_java("ProduceConsume.java", kafka_broker, topic, "3", "500", f"{topic}-group")
    assert results(output) == {
        "acked": "500",
        "assigned": "3",
        "committed": "500",
        "received": "500",
        "distinct": "500",
    }


STRATEGIES = ("range", "cooperative_sticky")


def group_results() -> dict[str, str]:
    expected = {}
    for strategy in STRATEGIES:
        for name, value in {
            "acked": "400",
            "member_0_has_partitions": "true",
            "member_1_has_partitions": "true",
            "describe_state": "Stable",
            "describe_members": "2",
            "describe_assignor": strategy.replace("_", "-"),
            "delete_active": "GroupNotEmptyException",
            "closed_state": "Empty",
            "altered_offset": "1",
            "delete_offsets": "ok",
            "offsets_after_delete": "3",
            "delete_empty": "ok",
            "listed_after_delete": "false",
            "describe_deleted": "GroupIdNotFoundException",
            "assigned": "4",
            "distinct_assigned": "4",
            "received": "400",
            "distinct": "400",
            "committed": "400",
        }.items():
            expected[f"{strategy}_{name}"] = value
    return expected


@pytest.mark.parametrize(
    ("kind", "replicas"),
    [("single", 1), pytest.param("cluster", 3, marks=pytest.mark.slow)],
)
def test_two_consumers_in_a_group_share_the_partitions_with_each_assignor(
    request: pytest.FixtureRequest, kind: str, replicas: int
) -> None:
    """The idempotent producer (acks=all), then two group members with the range and the
    cooperative-sticky assignor: each gets partitions, every record is read once, and the
    commits cover them all; then the Admin API's group calls (describe, alter and delete
    offsets, delete the group) on the group while active and once its members left."""
    printed = both(
        request,
        kind,
        "Groups.java",
        unique("groups"),
        "4",
        str(replicas),
        "400",
        ",".join(s.replace("_", "-") for s in STRATEGIES),
    )
    assert printed == group_results()


@pytest.mark.slow
def test_a_consumer_fetches_from_the_replica_in_its_rack(request: pytest.FixtureRequest) -> None:
    """KIP-392: with client.rack a follower's rack, the Java consumer receives the records
    from that follower (its per-node byte counts say which node served); without, from
    the leader."""
    printed = both(request, "cluster", "RackFetch.java", unique("rack"), "1000")
    assert printed == {
        "leader_rack_differs": "true",
        "with_rack_received": "1000",
        "with_rack_served_by_leader": "false",
        "with_rack_served_in_client_rack": "true",
        "no_rack_served_by_leader": "true",
    }


ADMIN = {
    "cluster_id_present": "true",
    "controller_is_a_node": "true",
    "create_existing": "TopicExistsException",
    "create_bad_replication": "InvalidReplicationFactorException",
    "list_has_created": "true",
    "describe_partitions": "2",
    "describe_internal": "false",
    "describe_missing": "UnknownTopicOrPartitionException",
    "config_initial_retention.ms": "3600000 DYNAMIC_TOPIC_CONFIG",
    "config_initial_cleanup.policy": "delete DEFAULT_CONFIG",
    "config_set_retention.ms": "7200000 DYNAMIC_TOPIC_CONFIG",
    "config_set_segment.bytes": "1048576 DYNAMIC_TOPIC_CONFIG",
    "config_deleted_retention.ms": "604800000 DEFAULT_CONFIG",
    "config_unknown": "InvalidConfigurationException",
    "config_bad_value": "InvalidConfigurationException",
    "partitions_increased": "3",
    "partitions_decrease": "InvalidPartitionsException",
    "partitions_same": "InvalidPartitionsException",
    # Ten records, the largest timestamp (50 s after the first) on offset 6.
    "offsets_earliest": "0",
    "offsets_earliest_local": "0",
    "offsets_for_timestamp": "3",
    "offsets_latest": "10",
    "offsets_latest_tiered": "-1",
    "offsets_max_timestamp": "6 50000",
    "delete_records_low_watermark": "4",
    "delete_records_beyond": "OffsetOutOfRangeException",
    "offsets_after_delete_earliest": "4",
    "offsets_after_delete_earliest_local": "4",
    "offsets_after_delete_for_timestamp": "4",
    "offsets_after_delete_latest": "10",
    "offsets_after_delete_latest_tiered": "-1",
    "offsets_after_delete_max_timestamp": "6 50000",
    "reassignment_listed_after": "0",
    "reassignment_replicas_moved": "true",
    "reassignment_unknown_topic": "UnknownTopicOrPartitionException",
    "elect_leader_is_preferred": "true",
    "elect_again": "ElectionNotNeededException",
    "log_dirs_sized": "true",
    # Edges: empty partitions, unknown names, validate-only, list configs.
    "edge_validate_only": "ok",
    "edge_validate_only_listed": "false",
    "edge_empty_earliest": "0 -1 true",
    "edge_empty_for_timestamp": "-1 -1 false",
    "edge_empty_latest": "0 -1 true",
    "edge_empty_max_timestamp": "-1 -1 false",
    "edge_offsets_unknown": "UnknownTopicOrPartitionException",
    "edge_delete_records_hw": "0",
    "edge_cancel_no_reassignment": "NoReassignmentInProgressException",
    "edge_reassign_bad_broker": "InvalidReplicaAssignmentException",
    "edge_list_reassignments_unknown": "0",
    "edge_elect_unknown": "UnknownTopicOrPartitionException",
    "edge_elect_unclean_not_needed": "ElectionNotNeededException",
    "edge_partitions_unknown": "UnknownTopicOrPartitionException",
    "edge_partitions_validate_only": "ok",
    "edge_partitions_after_validate": "1",
    "edge_append_subtract_leader.replication.throttled.replicas": "0:2 DYNAMIC_TOPIC_CONFIG",
    "edge_append_not_a_list": "InvalidConfigurationException",
    "edge_config_unknown_topic": "UnknownTopicOrPartitionException",
    "edge_create_bad_name": "InvalidTopicException",
    "edge_create_bad_config": "InvalidConfigurationException",
    "edge_create_zero_partitions": "InvalidPartitionsException",
    "deleted_listed": "false",
    "delete_missing": "UnknownTopicOrPartitionException",
}


@pytest.mark.parametrize(
    ("kind", "brokers"),
    [("single", 1), pytest.param("cluster", 3, marks=pytest.mark.slow)],
)
def test_the_admin_api_answers_as_apache_kafka(
    request: pytest.FixtureRequest, kind: str, brokers: int
) -> None:
    """Topics, configs (APPEND and SUBTRACT on list configs too), partitions, ListOffsets
    for every OffsetSpec (-1 to -5 and a timestamp), DeleteRecords, a reassignment then a
    preferred election, DescribeCluster and DescribeLogDirs, with the errors of bad
    arguments (AdminApi.java)."""
    printed = both(request, kind, "AdminApi.java", unique("admin"))
    replicas = min(3, brokers)
    assert printed == {
        **ADMIN,
        "cluster_nodes": str(brokers),
        "describe_replicas": str(replicas),
        "describe_isr": str(replicas),
        # Alone, the reassignment keeps the one replica, which already leads.
        "elect_preferred": "ok" if brokers > 1 else "ElectionNotNeededException",
        "log_dirs_brokers": str(brokers),
        "log_dirs_replicas": str(3 * replicas),
    }


TRANSACTIONS = {
    "state": "CompleteCommit",
    "committed_offset": "7",
    "read_committed": "c0,c1,c2,c3,c4,c5,c6",
    "read_uncommitted": "c0,c1,c2,c3,c4,a0,a1,a2,a3,a4,c5,c6",
}


TRANSACTIONS_V2 = {
    **TRANSACTIONS,
    "epoch_after_three": "3",
    "epoch_after_fencing_and_one_more": "5",
    # its first batch, added by the partition's leader, meets the bumped epoch
    "fenced_at_send": "InvalidProducerEpochException",
    "fenced_at_commit": "InvalidProducerEpochException",
}


@pytest.mark.parametrize("kind", ["single", "cluster"])
def test_transactions_commit_abort_send_offsets_and_fence_as_on_apache_kafka(
    request: pytest.FixtureRequest, kind: str
) -> None:
    """Transactions v2, as both brokers finalize `transaction.version` 2: every transaction
    ends at the next epoch (three, then one more after the fencing InitProducerId's); on
    three brokers the topic has three replicas."""
    name = unique("java-txn")
    replicas = "1" if kind == "single" else "3"
    printed = both(request, kind, "Transactions.java", name, name, name, replicas)
    assert printed == TRANSACTIONS_V2


def test_transactions_v1_when_the_broker_finalizes_an_older_version(tmp_path: Path) -> None:
    """With `transaction.version` 1 the Java client keeps to transactions v1: explicit
    AddPartitionsToTxn and AddOffsetsToTxn, and the epoch only bumped by InitProducerId."""
    broker = BrokerProcess(tmp_path, {"transaction.version": "1"})
    broker.start()
    try:
        name = unique("java-txn-v1")
        printed = results(run_java("Transactions.java", broker.bootstrap, name, name, name, "1"))
    finally:
        broker.stop()
    assert printed == {
        **TRANSACTIONS,
        "epoch_after_three": "0",
        "epoch_after_fencing_and_one_more": "1",
        # AddPartitionsToTxn, sent before its first batch, meets the bumped epoch
        "fenced_at_send": "ProducerFencedException",
        "fenced_at_commit": "ProducerFencedException",
    }
