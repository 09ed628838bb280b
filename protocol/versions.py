"""The request versions tierbroker decodes and answers, per API key.

Pinned here, not taken from whichever schemas kio ships: a kio upgrade cannot change what
the broker advertises or accepts; widening a range is a change made and tested on purpose.
Every range lies within kio's schemas (a test holds it). Produce is advertised from v0, as
Kafka 4 does (`broker.handlers.api_versions`), yet decoded from v3 only.
"""

from __future__ import annotations

SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    0: (3, 13),  # Produce
    1: (4, 18),  # Fetch
    2: (1, 11),  # ListOffsets
    3: (0, 13),  # Metadata
    8: (2, 10),  # OffsetCommit
    9: (1, 10),  # OffsetFetch
    10: (0, 6),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    17: (0, 1),  # SaslHandshake (v0: raw tokens follow; v1: SaslAuthenticate requests)
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 6),  # InitProducerId
    23: (2, 4),  # OffsetForLeaderEpoch
    24: (0, 5),  # AddPartitionsToTxn (v4+: from brokers, verifying or adding: KIP-890)
    25: (0, 4),  # AddOffsetsToTxn
    26: (0, 5),  # EndTxn (v5: transactions v2, KIP-890 part 2)
    27: (1, 2),  # WriteTxnMarkers
    28: (0, 5),  # TxnOffsetCommit (v5: transactions v2)
    29: (1, 3),  # DescribeAcls (v0 gone in Kafka 4, and from kio)
    30: (1, 3),  # CreateAcls
    31: (1, 3),  # DeleteAcls
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    35: (1, 5),  # DescribeLogDirs
    36: (0, 2),  # SaslAuthenticate (v1+: session lifetime, KIP-368)
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 0),  # AlterPartitionReassignments
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    48: (0, 1),  # DescribeClientQuotas
    49: (0, 1),  # AlterClientQuotas
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    60: (0, 2),  # DescribeCluster
    61: (0, 0),  # DescribeProducers
    65: (0, 0),  # DescribeTransactions
    66: (0, 2),  # ListTransactions
    75: (0, 0),  # DescribeTopicPartitions
}
