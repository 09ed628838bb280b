"""tierbroker in a user's tests: a real Kafka-protocol cluster in the test's process.

The pytest plugin (`tierbroker.testing.plugin`, loaded by pytest through the `pytest11`
entry point) gives the fixtures `tierbroker` (one broker) and `tierbroker_cluster` (a
factory); `cluster_fixture` makes one of any scope. `TierbrokerCluster` is the handle
they give, usable without pytest too. Names are imported lazily, so loading the plugin
costs a test run nothing until a fixture is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tierbroker.testing.clients import Record
    from tierbroker.testing.cluster import S3Tier, TierbrokerCluster
    from tierbroker.testing.plugin import cluster_fixture
    from tierbroker.testing.views import BrokerInfo, PartitionTier

__all__ = [
    "BrokerInfo",
    "PartitionTier",
    "Record",
    "S3Tier",
    "TierbrokerCluster",
    "cluster_fixture",
]


def __getattr__(name: str) -> Any:
    if name == "Record":
        from tierbroker.testing import clients

        return clients.Record
    if name == "cluster_fixture":
        from tierbroker.testing import plugin

        return plugin.cluster_fixture
    if name in ("BrokerInfo", "PartitionTier"):
        from tierbroker.testing import views

        return getattr(views, name)
    if name in __all__:
        from tierbroker.testing import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module 'tierbroker.testing' has no attribute {name!r}")
