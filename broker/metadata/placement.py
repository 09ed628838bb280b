"""Replica placement for new partitions, as Kafka's `AdminUtils.assignReplicasToBrokers`.

Without racks: replicas of successive partitions start on successive brokers from a
random start, and followers are shifted by a per-partition step, so leaders and
followers both spread evenly. With racks on every broker: brokers are interleaved
rack by rack first, so a partition's replicas fall in as many racks as possible.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from tierbroker.protocol.errors import ErrorCode, KafkaError


def assign_replicas(
    racks: Mapping[int, str | None],
    partitions: int,
    replication_factor: int,
    first_partition: int = 0,
    start_index: int | None = None,
) -> dict[int, tuple[int, ...]]:
    """Replicas of partitions `first_partition` .. `first_partition + partitions - 1`.

    `racks` maps every live broker to its rack. INVALID_REPLICATION_FACTOR if there are
    fewer brokers than the replication factor; rack-aware only if every broker has a rack
    (Kafka refuses a mix; here the mix falls back to rack-unaware placement).
    """
    brokers = sorted(racks)
    if replication_factor > len(brokers):
        raise KafkaError(
            ErrorCode.invalid_replication_factor,
            f"Replication factor: {replication_factor} larger than available brokers: "
            f"{len(brokers)}.",
        )
    rack_aware = bool(brokers) and all(racks[b] for b in brokers)
    if rack_aware:
        brokers = _rack_alternated(racks)
    n = len(brokers)
    rack_count = len({racks[b] for b in brokers})
    start = random.randrange(n) if start_index is None else start_index % n
    shift = random.randrange(n) if start_index is None else start_index % n
    assignment: dict[int, tuple[int, ...]] = {}
    for index in range(first_partition, first_partition + partitions):
        if index > 0 and index % n == 0:
            shift += 1
        first = (index + start) % n
        replicas = [brokers[first]]
        if not rack_aware:
            replicas += [
                brokers[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)
            ]
        else:
            # A follower goes to a rack and a broker without a replica yet, while there are any.
            used_racks = {racks[brokers[first]]}
            k = 0
            while len(replicas) < replication_factor:
                broker = brokers[_replica_index(first, shift * rack_count, k, n)]
                k += 1
                if (racks[broker] not in used_racks or len(used_racks) == rack_count) and (
                    broker not in replicas
                ):
                    replicas.append(broker)
                    used_racks.add(racks[broker])
        assignment[index] = tuple(replicas)
    return assignment


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    step = 1 + (shift + j) % (n - 1)
    return (first + step) % n


def _rack_alternated(racks: Mapping[int, str | None]) -> list[int]:
    """Brokers ordered rack by rack: a1, b1, c1, a2, b2, c2, ..."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(racks):
        by_rack.setdefault(str(racks[broker]), []).append(broker)
    ordered: list[int] = []
    columns = [by_rack[r] for r in sorted(by_rack)]
    for i in range(max(len(c) for c in columns)):
        ordered += [c[i] for c in columns if i < len(c)]
    return ordered
