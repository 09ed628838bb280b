from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.broker_process import BrokerProcess
from tests.integration.pipeline_topic import TieredTopic, create_tiered_topic


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh broker with the shipped config, on a free port, in a temp dir."""
    process = BrokerProcess(tmp_path).start()
    yield process
    process.stop()
    assert "Traceback" not in process.log(), process.log()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type[BrokerProcess]]:
    """For tests that restart or configure the broker themselves; stops what they start."""
    started: list[BrokerProcess] = []

    class Factory(BrokerProcess):
        def start(self, timeout_s: float = 60.0) -> BrokerProcess:
            started.append(self)
            return super().start(timeout_s)

    yield Factory
    for process in started:
        process.kill()


@pytest.fixture(scope="session")
def tiered_topic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    """200k records in a broker's remote tier, shared read-only by the pipeline tests."""
    topic = create_tiered_topic(tmp_path_factory.mktemp("pipeline"))
    yield topic
    topic.broker.stop()
