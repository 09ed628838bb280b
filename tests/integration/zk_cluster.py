"""Brokers as separate processes coordinated by a real ZooKeeper, each started as a user
starts one: `tierbroker serve` with `metadata.store=zookeeper`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient

from tests.integration.broker_process import BrokerProcess
from tests.zookeeper import ZooKeeperServer

SESSION_TIMEOUT_MS = 4000
_chroots = itertools.count()


class ZooKeeperCluster:
    def __init__(
        self,
        zookeeper: ZooKeeperServer,
        directory: Path,
        brokers: int = 3,
        overrides: dict[str, str] | None = None,
    ) -> None:
        self.zookeeper = zookeeper
        self.chroot = f"/cluster-{next(_chroots)}"
        self.brokers: dict[int, BrokerProcess] = {}
        for broker_id in range(brokers):
            self.brokers[broker_id] = BrokerProcess(
                directory / f"broker-{broker_id}",
                {
                    "metadata.store": "zookeeper",
                    "zookeeper.connect": zookeeper.connect + self.chroot,
                    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
                    "broker.id": str(broker_id),
                    "broker.rack": "abc"[broker_id % 3],
                    "replica.lag.time.max.ms": "3000",
                    **(overrides or {}),
                },
            )
            (directory / f"broker-{broker_id}").mkdir(parents=True, exist_ok=True)

    def start(self) -> ZooKeeperCluster:
        for broker in self.brokers.values():
            broker.start(timeout_s=30)
        return self

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.kill()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def restart(self, broker_id: int) -> None:
        self.brokers[broker_id] = self.brokers[broker_id].restarted(timeout_s=60)

    def partition_state(self, topic: str, partition: int) -> tuple[int, list[int]]:
        """(leader, ISR) as the cluster's metadata says, from a live broker."""
        admin = self.admin()
        metadata = admin.list_topics(topic, timeout=10)
        found = metadata.topics[topic].partitions[partition]
        return found.leader, list(found.isrs)

    def controller(self) -> int:
        admin = self.admin()
        return int(admin.describe_cluster().result(10).controller.id)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except Exception:  # a broker answering while it moves: ask again
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
