"""A follower's replica fetcher held before each fetch: a lagging follower on demand, for
tests of an EmbeddedCluster (the helpers run on the cluster's event loop)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from tests.integration.waiting import wait_for
from tierbroker.broker.replication.replica_fetcher import ReplicaFetcher
from tierbroker.broker.server.embedded import EmbeddedCluster


class HeldFetcher:
    """A follower's replica fetcher, held before each fetch until let through one at a
    time, or released; used on the cluster's event loop."""

    def __init__(self, fetcher: ReplicaFetcher, partition_max_bytes: int) -> None:
        self.fetcher = fetcher
        self.config = fetcher.config
        self.send = fetcher.client.send
        self.permits = asyncio.Semaphore(0)
        self.held = asyncio.Event()
        self.released = False
        # One batch per fetch, so that one fetch leaves the follower short of the leader.
        fetcher.config = replace(fetcher.config, max_bytes=partition_max_bytes)
        fetcher.client.send = self._send  # type: ignore[method-assign]

    async def _send(self, body: Any) -> Any:
        if not self.released:
            self.held.set()
            await self.permits.acquire()
            self.held.clear()
        return await self.send(body)

    async def step(self) -> None:
        """Let one fetch through; return once its answer is taken and the next is held."""
        self.held.clear()
        self.permits.release()
        await self.held.wait()

    async def release(self) -> None:
        self.released = True
        self.fetcher.config = self.config
        self.fetcher.client.send = self.send  # type: ignore[method-assign]
        self.permits.release()


def hold_fetcher(cluster: EmbeddedCluster, follower: int, leader: int) -> HeldFetcher:
    def fetchers() -> list[ReplicaFetcher]:
        registry = cluster.broker(follower).replicas.fetchers.fetchers
        return [f for (leader_id, _, _), f in registry.items() if leader_id == leader]

    # A follower starts its fetcher once it has created the log, after the metadata says so.
    wait_for(lambda: cluster.read(fetchers), f"broker {follower} to fetch from {leader}")

    async def hold() -> HeldFetcher:
        [fetcher] = fetchers()
        held = HeldFetcher(fetcher, partition_max_bytes=1)
        await held.held.wait()  # the fetch in flight was answered; the next one waits
        return held

    return cluster.call(hold())
