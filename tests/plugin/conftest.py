"""The pytest plugin's acceptance suite: tierbroker used as an application's test suite
uses it. Nothing here but the plugin, which pytest loads through its entry point; run in
parallel with `pytest -n 2 tests/plugin` (`make test` runs it beside the other tests).

The clusters that tests share (one per module that uses them, per xdist worker):
"""

from tierbroker.testing import cluster_fixture

racked_cluster = cluster_fixture(
    "module", brokers=3, racks=["a", "b", "c"], follower_fetching=True, tiering=True
)
