"""`EmbeddedCluster`: a tierbroker cluster running inside this process, for tests and demos.

The brokers and their in-process coordination service run on an event loop of their
own, in a background thread, so the caller may use blocking clients (confluent-kafka,
kafka-python) or its own event loop against them. Every broker listens, and serves its
metrics, on a free loopback port unless told otherwise; data lives in the directory
given.

Faults on demand: `stop_broker` (a SIGTERM: leadership moves first), `kill_broker` (a
crash: nothing flushed or checkpointed, the session left to expire; leadership moves
once it has), `start_broker` (again, on the same port, with its logs, recovered after a
crash), `expire_session` (the broker's metadata-store
session ends, as when ZooKeeper loses it: it re-registers, and the controller reacts
as to a broker that went and came back), `suspend_session` / `resume_session` (the
broker cannot reach the store while its clients still reach it, as in a partition).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from tierbroker.broker.config.broker_config import load_config
from tierbroker.broker.metadata.inprocess_store import InProcessSession
from tierbroker.broker.server.broker_server import BrokerServer
from tierbroker.broker.server.cluster_runner import ClusterRunner

T = TypeVar("T")


class EmbeddedCluster:
    def __init__(
        self,
        directory: Path,
        brokers: int = 1,
        racks: list[str] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        settings = {
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "metrics.port": "0",
            "log.dirs": str(directory),
            **(properties or {}),
        }
        self.config = load_config(None, [f"{k}={v}" for k, v in settings.items()])
        self.brokers_count = brokers
        self.racks = racks or []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.runner: ClusterRunner | None = None

    # Lifecycle -----------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> EmbeddedCluster:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="tierbroker", daemon=True)
        self._thread.start()

        async def start() -> ClusterRunner:
            runner = ClusterRunner(self.config, self.brokers_count, self.racks)
            self.runner = runner
            await runner.start()
            return runner

        self.call(start(), timeout_s)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop every broker and the service, then the thread. Idempotent."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.stop(), loop).result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout_s)
        loop.close()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def call(self, work: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        """Run `work` on the cluster's event loop and wait for its result."""
        if self._loop is None:
            raise RuntimeError("the cluster is not running")
        future: Future[T] = asyncio.run_coroutine_threadsafe(work, self._loop)
        return future.result(timeout_s)

    def read(self, read: Callable[[], T], timeout_s: float = 30.0) -> T:
        """`read()` run on the cluster's event loop, where the brokers' state may be read
        safely (nothing changes it while it runs), and its result."""

        async def run() -> T:
            return read()

        return self.call(run(), timeout_s)

    # Where it is ---------------------------------------------------------------------

    @property
    def brokers(self) -> list[BrokerServer]:
        assert self.runner is not None
        return self.runner.brokers

    def broker(self, broker_id: int) -> BrokerServer:
        assert self.runner is not None
        return self.runner.broker(broker_id)

    def address(self, broker_id: int) -> str:
        registration = self.broker(broker_id).registration
        assert registration is not None, f"broker {broker_id} never registered"
        first = registration.endpoints[0]  # the first listener's, as clients bootstrap
        return f"{first.host}:{first.port}"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(self.address(b.broker_id) for b in self.brokers)

    # Faults --------------------------------------------------------------------------

    def stop_broker(self, broker_id: int, timeout_s: float = 60.0) -> None:
        assert self.runner is not None
        self.call(self.runner.stop_broker(broker_id), timeout_s)

    def kill_broker(self, broker_id: int, timeout_s: float = 60.0) -> None:
        assert self.runner is not None
        self.call(self.runner.kill_broker(broker_id), timeout_s)

    def start_broker(self, broker_id: int, timeout_s: float = 60.0) -> None:
        assert self.runner is not None
        self.call(self.runner.start_broker(broker_id), timeout_s)

    def _session(self, broker_id: int) -> InProcessSession:
        session = self.broker(broker_id).store
        assert isinstance(session, InProcessSession), "only in-process sessions fail on demand"
        return session

    def expire_session(self, broker_id: int) -> None:
        self.call(self._session(broker_id).expire())

    def suspend_session(self, broker_id: int) -> None:
        """The broker loses its metadata store (clients still reach it); after the session
        timeout the store expires its session."""
        session = self._session(broker_id)

        async def suspend() -> None:
            session.suspend()

        self.call(suspend())

    def resume_session(self, broker_id: int) -> None:
        self.call(self._session(broker_id).resume())
