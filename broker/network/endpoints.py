"""Where a running broker can be reached: the ports it bound, and the address it advertises.

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

from tierbroker.broker.config.broker_config import BrokerConfig, Endpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerEndpoints:
    """A broker's bound ports; `host` and `port` are those it advertises to clients."""

    broker_id: int
    host: str
    port: int
    metrics_port: int | None  # None: no metrics endpoint

    @property
    def advertised(self) -> Endpoint:
        return Endpoint(self.host, self.port)


def broker_endpoints(
    config: BrokerConfig, bound_port: int, bound_metrics_port: int | None
) -> BrokerEndpoints:
    """The advertised address: `advertised.listeners` (else `listeners`), with a port of 0
    replaced by the port bound."""
    host, port = config.advertised_listener
    return BrokerEndpoints(
        broker_id=config.broker_id,
        host=host,
        port=port or bound_port,
        metrics_port=bound_metrics_port,
    )


def write_ports_file(path: Path, brokers: list[BrokerEndpoints]) -> None:
    """Write `[{"broker_id", "host", "port", "metrics_port"}, ...]` to `path` atomically: a
    reader sees the whole list or no file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps([asdict(b) for b in brokers]) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def remove_ports_file(path: Path) -> None:
    path.unlink(missing_ok=True)
