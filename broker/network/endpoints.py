"""Where a running broker can be reached: the ports it bound, and the addresses it advertises.

A listener or metrics port of 0 binds a free port; the broker then advertises the
port it bound, as Kafka does (an advertised port of 0 also stands for it). Scripts
and test fixtures find the ports in the file `serve --ports-file` writes: a JSON list
with one object per broker of the process, written atomically once every broker
listens, and removed when the process stops.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.config.listeners import Listener


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerEndpoints:
    """A broker's advertised listeners, with the ports bound; `host` and `port` are the
    first listener's (where clients of a one-listener broker connect)."""

    broker_id: int
    host: str
    port: int
    metrics_port: int | None  # None: no metrics endpoint
    listeners: tuple[Listener, ...]

    def listener(self, name: str) -> Listener:
        return next(x for x in self.listeners if x.name == name)


def broker_endpoints(
    config: BrokerConfig, bound_ports: dict[str, int], bound_metrics_port: int | None
) -> BrokerEndpoints:
    """The advertised listeners (`advertised.listeners`, else `listeners`), each port of 0
    replaced by its listener's port bound."""
    advertised = tuple(
        x if x.port else x.with_port(bound_ports[x.name]) for x in config.listener_config.advertised
    )
    return BrokerEndpoints(
        broker_id=config.broker_id,
        host=advertised[0].host,
        port=advertised[0].port,
        metrics_port=bound_metrics_port,
        listeners=advertised,
    )


def write_ports_file(path: Path, brokers: list[BrokerEndpoints]) -> None:
    """Write `[{"broker_id", "host", "port", "metrics_port", "listeners"}, ...]` to `path`
    atomically (`listeners`: name, security_protocol, host and port of each): a reader sees
    the whole list or no file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps([asdict(b) for b in brokers]) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def remove_ports_file(path: Path) -> None:
    path.unlink(missing_ok=True)
