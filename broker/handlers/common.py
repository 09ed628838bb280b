"""What every handler needs: the broker's parts, and building kio entities of any version.

A response class of one API differs between versions in which fields it has;
`make` builds an entity from keyword arguments, keeping those the version knows.
"""

from __future__ import annotations

import dataclasses
import datetime
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.static.constants import EntityType

from tierbroker.broker.cluster.controller import Controller
from tierbroker.broker.config import BrokerConfig
from tierbroker.broker.groups.coordinator import GroupCoordinator
from tierbroker.broker.replica_manager import ReplicaManager
from tierbroker.broker.topic_metrics import BrokerTopicMetrics

NO_THROTTLE = datetime.timedelta(0)
# The address of the client whose request is being handled (JoinGroup records it).
CLIENT_HOST: ContextVar[str] = ContextVar("client_host", default="")


@dataclass(frozen=True, slots=True)
class BrokerContext:
    config: BrokerConfig
    replicas: ReplicaManager
    controller: Controller
    groups: GroupCoordinator
    topic_metrics: BrokerTopicMetrics


@cache
def response_module(api_key: int, api_version: int) -> ModuleType:
    return load_payload_module(api_key, api_version, EntityType.response)


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def make(cls: type, **values: Any) -> Any:
    """An instance of the kio entity `cls` from the `values` its version has."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def field(entity: Any, name: str, default: Any = None) -> Any:
    """A request field that only some versions have."""
    return getattr(entity, name, default)
