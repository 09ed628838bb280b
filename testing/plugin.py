"""The pytest plugin: tierbroker clusters as fixtures (entry point `pytest11`).

Nothing starts unless a test asks: `tierbroker` is one broker for the test;
`tierbroker_cluster(...)` starts a cluster with `TierbrokerCluster`'s options (brokers,
racks, configs, tiering) and stops every cluster it started when the test ends;
`cluster_fixture(scope=..., **options)` makes a fixture of any scope, for clusters that
tests share. Every broker binds free ports and keeps its data under pytest's temporary
directories, so tests in parallel (pytest-xdist) never clash.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

if TYPE_CHECKING:
    from tierbroker.testing.cluster import TierbrokerCluster

Scope = Literal["session", "package", "module", "class", "function"]


@pytest.fixture
def tierbroker_cluster(tmp_path: Path) -> Iterator[Callable[..., TierbrokerCluster]]:
    """A factory: `tierbroker_cluster(brokers=3, racks=["a", "b", "c"], tiering=True)`
    starts a cluster (options of `TierbrokerCluster`); each stops when the test ends."""
    from tierbroker.testing.cluster import TierbrokerCluster

    numbers = itertools.count()
    with ExitStack() as started:

        def start(brokers: int = 1, **options: Any) -> TierbrokerCluster:
            directory = tmp_path / f"tierbroker-{next(numbers)}"
            cluster = TierbrokerCluster(directory, brokers, **options)
            started.callback(cluster.stop)
            return cluster.start()

        yield start


@pytest.fixture
def tierbroker(
    tierbroker_cluster: Callable[..., TierbrokerCluster],
) -> TierbrokerCluster:
    """One broker for this test, no remote tier."""
    return tierbroker_cluster()


def cluster_fixture(scope: Scope = "module", brokers: int = 1, **options: Any) -> Any:
    """A fixture giving one cluster (options of `TierbrokerCluster`) to every test of its
    scope; assign it to a name in a conftest or test module:

        kafka = cluster_fixture("module", brokers=3, racks=["a", "b", "c"], tiering=True)
    """

    @pytest.fixture(scope=scope)
    def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TierbrokerCluster]:
        from tierbroker.testing.cluster import TierbrokerCluster

        with TierbrokerCluster(tmp_path_factory.mktemp("tierbroker"), brokers, **options) as c:
            yield c

    return cluster
