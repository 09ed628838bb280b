"""`ClusterRunner`: the brokers one process runs, and the coordination service they share.

`metadata.store=inprocess` (the default): an `InProcessZooKeeper` in this process, its
znodes in `cluster-metadata.db` under the first log dir, and N brokers (`--brokers N`)
with ids from `broker.id` up, ports from the one in `listeners` up (port 0: each binds
a free one), racks from `--racks` in turn, and log dirs `<log.dirs>/broker-<id>` when
N > 1, beside the LocalFs remote tier they share (`<log.dirs>/remote` unless
`rsm.config.dir` says). Each broker's ports are bound before it is built: by the
preflight (`serve`), or here. `metadata.store=zookeeper`: each broker opens its own
session with the ZooKeeper at `zookeeper.connect`, so brokers in other processes or on
other hosts join the same cluster.

Start: the service, then every broker joins (registers), then every broker serves: a
cluster starts whole, so the internal topics its brokers create at start are replicated
across all of them. Stop: every broker at once (with no controlled shutdown: the whole
cluster goes), then the service.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from functools import partial
from typing import Any

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.config.listeners import Listener
from tierbroker.broker.metadata.inprocess_store import InProcessSession, InProcessZooKeeper
from tierbroker.broker.metadata.store import MetadataStore
from tierbroker.broker.metadata.zk_store import ZooKeeperStore
from tierbroker.broker.server.broker_server import BrokerServer
from tierbroker.broker.server.preflight import BoundPorts, bind_all, bind_ports
from tierbroker.broker.server.remote_storage import local_remote_dir

log = logging.getLogger(__name__)

RUNNING_BROKER: ContextVar[int | None] = ContextVar("running_broker", default=None)
"""The broker whose work runs in this context: each broker starts and stops under its id,
so the tasks it creates carry it, and log lines can say which broker wrote them."""


async def _as_broker(broker: BrokerServer, work: Coroutine[Any, Any, None]) -> None:
    RUNNING_BROKER.set(broker.broker_id)
    await work


METADATA_DB = "cluster-metadata.db"


def broker_configs(config: BrokerConfig, brokers: int, racks: list[str]) -> list[BrokerConfig]:
    """The config of each of `brokers` brokers run from `config`."""
    if brokers == 1:
        rack = racks[0] if racks else config.broker_rack
        return [config.model_copy(update={"broker_rack": rack})]
    # One remote tier for the cluster: a new leader reads what the old one copied.
    rsm_configs = {**config.rsm_configs, "dir": str(local_remote_dir(config))}
    configs = []
    for i in range(brokers):
        broker_id = config.broker_id + i
        log_dirs = ",".join(str(d / f"broker-{broker_id}") for d in config.log_dir_paths)
        update: dict[str, object] = {
            "broker_id": broker_id,
            "listeners": _listeners(config, partial(_nth_port, i)),
            "advertised_listeners": None,
            "log_dirs": log_dirs,
            "broker_rack": racks[i % len(racks)] if racks else config.broker_rack,
            "rsm_configs": rsm_configs,
        }
        if config.metrics_port > 0:
            update["metrics_port"] = config.metrics_port + i
        configs.append(config.model_copy(update=update))
    return configs


def _nth_port(i: int, listener: Listener) -> int:
    """The port of the `i`th broker's `listener`: the configured one up (0: any free one)."""
    return listener.port + i if listener.port else 0


def _listeners(config: BrokerConfig, port: Callable[[Listener], int]) -> str:
    """`config`'s listeners with the ports `port` gives them."""
    return ",".join(str(x.with_port(port(x))) for x in config.listener_config.listeners)


class ClusterRunner:
    def __init__(
        self,
        config: BrokerConfig,
        brokers: int = 1,
        racks: list[str] | None = None,
        ports: list[BoundPorts] | None = None,
    ):
        """`ports`: each broker's, in the order of `broker_configs` (None: bound here)."""
        self.config = config
        self.service: InProcessZooKeeper | None = None
        if config.metadata_store == "inprocess":
            self.service = InProcessZooKeeper(config.log_dir_paths[0] / METADATA_DB)
        configs = broker_configs(config, brokers, racks or [])
        bound = ports if ports is not None else bind_all(configs)
        self.brokers = [
            BrokerServer(c, self._session(c), p) for c, p in zip(configs, bound, strict=True)
        ]
        self.stop_requested = asyncio.Event()
        self.fatal_error: str | None = None
        self._watches: dict[int, asyncio.Task[None]] = {}  # of the broker now under each id

    def _session(self, config: BrokerConfig) -> MetadataStore:
        timeout = config.zookeeper_session_timeout_ms
        if self.service is not None:
            return self.service.session(timeout)
        assert config.zookeeper_connect is not None  # the config checks it
        return ZooKeeperStore(
            config.zookeeper_connect, timeout, config.zookeeper_connection_timeout_ms or timeout
        )

    async def start(self) -> None:
        if self.service is not None:
            await self.service.open()
        await asyncio.gather(*(_as_broker(b, b.join()) for b in self.brokers))
        await asyncio.gather(*(_as_broker(b, b.serve()) for b in self.brokers))
        for broker in self.brokers:
            self._start_watch(broker)

    def _start_watch(self, broker: BrokerServer) -> None:
        self._watches[broker.broker_id] = asyncio.get_running_loop().create_task(
            self._watch(broker), name=f"broker-{broker.broker_id}-watch"
        )

    async def _watch(self, broker: BrokerServer) -> None:
        """A broker that must stop (every log dir failed) stops the process."""
        await broker.stop_requested.wait()
        if broker.fatal_error is not None and self.fatal_error is None:
            self.fatal_error = broker.fatal_error
        self.stop_requested.set()

    def broker(self, broker_id: int) -> BrokerServer:
        return next(b for b in self.brokers if b.broker_id == broker_id)

    async def stop_broker(self, broker_id: int) -> None:
        """Stop one broker as SIGTERM would: its leadership moves first."""
        broker = self.broker(broker_id)
        await asyncio.create_task(_as_broker(broker, broker.stop()))

    async def kill_broker(self, broker_id: int) -> None:
        """Crash one broker (`BrokerServer.crash`): its in-process session is abandoned, so
        the controller moves its leadership once the session expires."""
        broker = self.broker(broker_id)
        if not isinstance(broker.store, InProcessSession):
            raise TypeError("only a broker with an in-process session can crash on demand")
        broker.store.abandon()
        await broker.crash()

    async def start_broker(self, broker_id: int) -> None:
        """Start a stopped broker again, on the port it had, with its logs."""
        old = self.broker(broker_id)
        update: dict[str, object] = {
            "listeners": _listeners(old.config, lambda x: old.ports.listener_ports[x.name])
        }
        if old.ports.metrics_port is not None:
            update["metrics_port"] = old.ports.metrics_port
        config = old.config.model_copy(update=update)
        new = BrokerServer(config, self._session(config), bind_ports(config))
        self.brokers[self.brokers.index(old)] = new
        await asyncio.create_task(_as_broker(new, new.start()))
        watch = self._watches.pop(broker_id, None)
        if watch is not None:  # it watched the broker stopped
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        self._start_watch(new)

    async def stop(self) -> None:
        """Stop every broker, then the service. A broker of a cluster that goes on (over
        ZooKeeper) hands its leadership over first; brokers that all stop do not."""
        for task in self._watches.values():
            task.cancel()
        await asyncio.gather(*self._watches.values(), return_exceptions=True)
        controlled = self.service is None
        await asyncio.gather(*(_as_broker(b, b.stop(controlled=controlled)) for b in self.brokers))
        if self.service is not None:
            await self.service.close()
