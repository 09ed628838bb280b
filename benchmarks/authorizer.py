"""The authorizer's cost: broker CPU per produce request with 1,000 ACLs, against no
authorizer, in the same run; and the cost of one check.

    .venv/bin/python -m benchmarks.authorizer [--requests 20000] [--repeat 3] [--json OUT]

Two brokers, started as users start them: one without an authorizer, one with Kafka's
StandardAuthorizer and 1,000 ACLs (literal and prefixed topic ACLs for 400 users, group
ACLs, and on the benchmark's topic an ALLOW for the producer beside DENYs for others, so
every produce request's check walks real entries). The same producer (librdkafka, one
100-byte record per request, acks=1) sends `--requests` requests to each, the brokers
taking turns round after round (ABBA); the broker's CPU seconds (/proc) per request are
compared, median of the rounds. On a shared machine the rounds spread by more than the
authorizer costs, so the cost of one check, measured alone with the same 1,000 ACLs, is
given too, as a share of the CPU of a request (one check a request of one topic).
`allow.everyone.if.no.acl.found=true` lets the benchmark create its ACLs before any exists
on the cluster; the topic written has ACLs, so it does not decide.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from benchmarks.targets import Broker, start_tierbroker, stop

TOPIC = "orders"
ACLS = 1000
AUTHORIZED = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}


def bindings() -> list[AclBinding]:
    """1,000 ACLs; the producer (User:ANONYMOUS) may write TOPIC and alter the cluster."""

    def topic(
        name: str,
        principal: str,
        op: AclOperation,
        pattern: Any,
        permission: AclPermissionType = AclPermissionType.ALLOW,
    ) -> AclBinding:
        return AclBinding(ResourceType.TOPIC, name, pattern, principal, "*", op, permission)

    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    made = [
        AclBinding(
            ResourceType.BROKER,  # confluent-kafka names the cluster BROKER
            "kafka-cluster",
            literal,
            "User:ANONYMOUS",
            "*",
            AclOperation.ALL,
            AclPermissionType.ALLOW,
        ),
        topic(TOPIC, "User:ANONYMOUS", AclOperation.WRITE, literal),
    ]
    made += [
        topic(TOPIC, f"User:other-{i}", AclOperation.WRITE, literal, AclPermissionType.DENY)
        for i in range(8)
    ]
    made += [topic(f"orders-{i}", f"User:u{i}", AclOperation.READ, literal) for i in range(400)]
    made += [topic(f"ord{i}-", f"User:u{i}", AclOperation.WRITE, prefixed) for i in range(300)]
    made += [
        AclBinding(
            ResourceType.GROUP,
            f"g{i}",
            literal,
            f"User:u{i}",
            "*",
            AclOperation.READ,
            AclPermissionType.ALLOW,
        )
        for i in range(ACLS - len(made))
    ]
    assert len(made) == ACLS
    return made


def prepare(broker: Broker, with_acls: bool) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    if with_acls:
        for future in admin.create_acls(bindings(), request_timeout=60).values():
            future.result(60)
    for future in admin.create_topics([NewTopic(TOPIC, 1, 1)]).values():
        future.result(30)


def produce_round(broker: Broker, requests: int) -> float:
    """Broker CPU seconds for `requests` produce requests of one record each."""
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "linger.ms": 0,
            "acks": 1,
            "max.in.flight.requests.per.connection": 1,
        }
    )
    producer.produce(TOPIC, b"warm")
    producer.flush(30)
    before = broker.cpu_seconds()
    value = b"x" * 100
    for _ in range(requests):
        producer.produce(TOPIC, value)
        producer.flush(30)
    return broker.cpu_seconds() - before


def check_cost_us() -> float:
    """One `Authorizer.authorize` of WRITE on TOPIC with the 1,000 ACLs, in microseconds."""
    from tierbroker.broker.security.authorizer import acl
    from tierbroker.broker.security.authorizer.authorizer import Authorizer, AuthorizerConfig
    from tierbroker.broker.security.principal import ANONYMOUS

    authorizer = Authorizer(AuthorizerConfig(frozenset()))
    for b in bindings():
        pattern = acl.ResourcePattern(
            acl.ResourceType(b.restype.value),
            b.name,
            acl.PatternType(b.resource_pattern_type.value),
        )
        entry = acl.AccessControlEntry(
            b.principal,
            b.host,
            acl.AclOperation(b.operation.value),
            acl.AclPermissionType(b.permission_type.value),
        )
        authorizer.acls.replace(pattern, authorizer.acls.get(pattern) | {entry})
    check = lambda: authorizer.authorize(  # noqa: E731
        ANONYMOUS, "127.0.0.1", acl.AclOperation.WRITE, acl.ResourceType.TOPIC, TOPIC
    )
    assert check()
    runs = 200_000
    return min(timeit.repeat(check, number=runs, repeat=3)) / runs * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    brokers: dict[str, Broker] = {}
    workdir = Path(tempfile.mkdtemp(prefix="bench-authorizer-"))
    try:
        for name, overrides in (("none", {}), ("1000 ACLs", AUTHORIZED)):
            (workdir / name).mkdir()
            brokers[name] = start_tierbroker(workdir / name, overrides)
        prepare(brokers["none"], with_acls=False)
        prepare(brokers["1000 ACLs"], with_acls=True)
        cpu: dict[str, list[float]] = {name: [] for name in brokers}
        order = list(brokers)
        for _ in range(args.repeat):  # ABBA: a drift of the machine's load favours neither
            for name in order:
                cpu[name].append(produce_round(brokers[name], args.requests) / args.requests * 1e6)
            order.reverse()
    finally:
        for broker in brokers.values():
            stop(broker)
        shutil.rmtree(workdir, ignore_errors=True)
    per_request = {name: statistics.median(us) for name, us in cpu.items()}
    overhead = per_request["1000 ACLs"] / per_request["none"] - 1
    check_us = check_cost_us()
    print(
        f"broker CPU per produce request, median of {args.repeat} rounds "
        f"of {args.requests} requests:"
    )
    for name, us in per_request.items():
        print(f"  {name:>10}: {us:7.1f} us   (rounds: {', '.join(f'{x:.1f}' for x in cpu[name])})")
    print(f"  measured difference: {overhead:+.1%} (the rounds' spread bounds what it resolves)")
    share = check_us / per_request["none"]
    print(
        f"one check (WRITE on a topic, 1,000 ACLs): {check_us:.2f} us; a produce request of "
        f"one topic makes one: {share:.1%} of its CPU (goal: under 5%)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "per_request_us": per_request,
                    "rounds_us": cpu,
                    "overhead": overhead,
                    "check_us": check_us,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
