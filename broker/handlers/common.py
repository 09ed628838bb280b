"""What every handler needs: the broker's parts, and building kio entities of any version.

A response class of one API differs between versions in which fields it has;
`make` builds an entity from keyword arguments, keeping those the version knows
and refusing a name no version of the class has (a misspelt field).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.static.constants import EntityType

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.config.listeners import Listener
from tierbroker.broker.controller.controller import Controller
from tierbroker.broker.coordinator.group.coordinator import GroupCoordinator
from tierbroker.broker.coordinator.transaction.coordinator import TransactionCoordinator
from tierbroker.broker.metadata.acl_store import AclStore
from tierbroker.broker.metadata.dynamic_broker_config import DynamicBrokerConfig
from tierbroker.broker.metadata.metadata_cache import MetadataCache
from tierbroker.broker.metadata.scram_credentials import ScramCredentialStore
from tierbroker.broker.metadata.topic_admin import TopicAdmin
from tierbroker.broker.metadata.zk_data import BrokerRegistration
from tierbroker.broker.metrics.topic_metrics import BrokerTopicMetrics
from tierbroker.broker.network.endpoints import BrokerEndpoints
from tierbroker.broker.network.request_context import current_request
from tierbroker.broker.quota.quota_managers import QuotaManagers
from tierbroker.broker.replication.replica_manager import ReplicaManager
from tierbroker.broker.security.authorizer.authorizer import Authorizer

NO_THROTTLE = datetime.timedelta(0)
_FIELD = re.compile(r"^    ([a-z]\w*): ", re.M)  # a field of a kio dataclass


@dataclass(frozen=True, slots=True)
class BrokerContext:
    config: BrokerConfig
    replicas: ReplicaManager
    metadata: MetadataCache
    admin: TopicAdmin
    dynamic_config: DynamicBrokerConfig
    groups: GroupCoordinator
    transactions: TransactionCoordinator
    controller: Controller
    topic_metrics: BrokerTopicMetrics
    endpoints: BrokerEndpoints  # the address advertised, with the ports bound
    quotas: QuotaManagers
    # With `authorizer.class.name` set: the ACLs' decision and their store; else None.
    authorizer: Authorizer | None = None
    acl_store: AclStore | None = None
    # The SCRAM users (DescribeUserScramCredentials / AlterUserScramCredentials).
    scram_credentials: ScramCredentialStore | None = None


def client_endpoint(registration: BrokerRegistration) -> Listener | None:
    """The broker's endpoint on the listener the request came in on: clients are told the
    addresses of their own listener, as Kafka does (None: the broker has no such listener)."""
    return registration.endpoint(current_request().listener_name)


@cache
def response_module(api_key: int, api_version: int) -> ModuleType:
    return load_payload_module(api_key, api_version, EntityType.response)


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@cache
def _names_in_any_version(cls: type) -> frozenset[str]:
    """The fields of `cls` in every version kio has of its API, read from the source of
    its generated modules (`kio/schema/<api>/vN/<kind>.py`): importing them all would hold
    the event loop for up to a few hundred ms."""
    api, _version, kind = cls.__module__.rsplit(".", 2)
    spec = importlib.util.find_spec(api)
    directories = spec.submodule_search_locations or [] if spec is not None else []
    block = re.compile(rf"^class {cls.__name__}\b.*?:\n(.*?)(?=^\S|\Z)", re.M | re.S)
    names: set[str] = set()
    for directory in directories:
        for source in Path(directory).glob(f"v*/{kind}.py"):
            for body in block.findall(source.read_text()):
                names.update(_FIELD.findall(body))
    return frozenset(names)


def make(cls: type, **values: Any) -> Any:
    """An instance of the kio entity `cls` from the `values` its version has.

    Raises TypeError for a name that no version of `cls` has.
    """
    kept = _kept_names(cls, tuple(values))
    if kept is None:
        return cls(**values)
    return cls(**{k: values[k] for k in kept})


@cache
def _kept_names(cls: type, given: tuple[str, ...]) -> tuple[str, ...] | None:
    """The names of `given` that `cls` has, or None if it has them all (a call site passes
    the same names every time, so this is worked out once per site and version)."""
    names = _field_names(cls)
    missing = set(given) - names
    unknown = missing - _names_in_any_version(cls) if missing else missing
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(unknown))} in any version")
    kept = tuple(k for k in given if k in names)
    return None if len(kept) == len(given) else kept


def field(entity: Any, name: str, default: Any = None) -> Any:
    """A request field that only some versions have."""
    return getattr(entity, name, default)
