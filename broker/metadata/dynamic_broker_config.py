"""`DynamicBrokerConfig`: broker configs changed at run time, as Kafka's of the same name.

A dynamic config is set for one broker (IncrementalAlterConfigs on broker `N`) or for the
whole cluster (the empty resource name), kept in `/config/brokers/<N>` or
`/config/brokers/<default>`, and seen by every broker through its `MetadataCache`. The
order of precedence is Kafka's: this broker's dynamic value, the cluster's dynamic default,
the static value (server.properties), the built-in default. As Kafka's `DynamicLogConfig`,
the dynamic ones are the broker properties that supply topic defaults (`log.retention.ms`,
`log.segment.bytes`, `log.cleanup.policy`, ...), each under the first name Kafka gives it:
a change applies at once to every topic without an override of its own. Besides them, as
Kafka's dynamic listener configs, the TLS stores of a listener (`ssl.keystore.location`
and the rest of Kafka's reconfigurable SSL configs, prefixed `listener.name.<l>.` or not),
for one broker only: `ListenerReconfigurable` checks them before they are written and
reloads them (an unchanged value whose key store file changed is reloaded at once, as
Kafka does). Every other broker property is static here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tierbroker.broker.metadata import zk_data as zk
from tierbroker.broker.metadata.metadata_cache import MetadataCache, MetadataDelta
from tierbroker.broker.metadata.store import MetadataStore, NoNodeError, StoreError, put
from tierbroker.broker.metadata.topic_admin import store_error
from tierbroker.broker.security.listener_ssl import is_reconfigurable
from tierbroker.protocol.errors import ErrorCode, KafkaError
from tierbroker.storage.log_config import LogConfig
from tierbroker.storage.topic_configs import TOPIC_CONFIGS, ConfigDef, broker_default

log = logging.getLogger(__name__)

# Each dynamic broker property and the topic config it supplies the default of; Kafka
# leaves out message.format.version, which must match across the cluster.
DYNAMIC_LOG_CONFIGS: Mapping[str, ConfigDef] = {
    d.synonyms[0].name: d
    for d in TOPIC_CONFIGS.values()
    if d.synonyms and d.name != "message.format.version"
}


class ListenerReconfigurable(Protocol):
    """The listeners' TLS stores (`ListenerSsl`), given this broker's dynamic configs;
    both raise ValueError (`ConfigError`) for stores a listener cannot take."""

    def check(self, dynamic: Mapping[str, str]) -> None: ...

    def reconfigure(self, dynamic: Mapping[str, str]) -> None: ...


class DynamicBrokerConfig:
    def __init__(
        self,
        broker_id: int,
        store: MetadataStore,
        cache: MetadataCache,
        static_log_defaults: Mapping[str, Any],
        listeners: ListenerReconfigurable | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.store = store
        self.cache = cache
        self.static_log_defaults = dict(static_log_defaults)
        self.listeners = listeners

    def entity(self, resource_name: str) -> str:
        """The store's entity of a broker resource: the cluster's defaults (""), or this
        broker's own; INVALID_REQUEST for another broker's, which only that broker serves."""
        if resource_name == "":
            return zk.DEFAULT_BROKER_ENTITY
        if resource_name == str(self.broker_id):
            return resource_name
        raise KafkaError(ErrorCode.invalid_request, f"broker {resource_name!r} is not this broker")

    def layers(self) -> tuple[dict[str, str], dict[str, str]]:
        """This broker's dynamic configs, and the cluster's dynamic defaults."""
        return (
            self.cache.broker_configs.get(str(self.broker_id), {}),
            self.cache.broker_configs.get(zk.DEFAULT_BROKER_ENTITY, {}),
        )

    def maybe_reconfigure_listeners(self, delta: MetadataDelta) -> None:
        """After a change of dynamic broker configs (the first read at start included),
        serve the listener stores they give. Stores that cannot be taken (written past the
        checks, or their files gone) are logged; the listener keeps the ones it has."""
        if self.listeners is None or not delta.broker_configs_changed:
            return
        try:
            self.listeners.reconfigure(self.layers()[0])
        except ValueError as e:
            log.error("broker %d: dynamic listener configs not applied: %s", self.broker_id, e)

    def log_defaults(self) -> dict[str, Any]:
        """The topic defaults in force: the static ones under the dynamic ones."""
        return self._log_defaults(*self.layers())

    def _log_defaults(self, own: Mapping[str, str], cluster: Mapping[str, str]) -> dict[str, Any]:
        defaults = dict(self.static_log_defaults)
        for prop, definition in DYNAMIC_LOG_CONFIGS.items():
            raw = own.get(prop, cluster.get(prop))
            if raw is not None:
                try:
                    defaults[definition.name] = _parsed(prop, raw, definition)
                except ValueError:
                    pass  # written past the checks (by another tool): the static value holds
        return defaults

    async def alter(
        self,
        resource_name: str,
        alter: Callable[[dict[str, str]], dict[str, str]],
        validate_only: bool,
        timeout_s: float = 30.0,
    ) -> None:
        """Replace the entity's dynamic configs with `alter(current)`, checked as Kafka checks
        them: only dynamic properties, values of their topic config's type and range,
        topic defaults they leave consistent, and listener stores the listeners take
        (INVALID_REQUEST otherwise)."""
        entity = self.entity(resource_name)
        current = self.cache.broker_configs.get(entity, {})
        configs = alter(dict(current))
        listener_configs = sorted(name for name in configs if is_reconfigurable(name))
        static = sorted(
            name
            for name in configs
            if name not in DYNAMIC_LOG_CONFIGS and name not in listener_configs
        )
        if static or (listener_configs and self.listeners is None):
            raise KafkaError(
                ErrorCode.invalid_request,
                f"Cannot update these configs dynamically: {', '.join(static or listener_configs)}",
            )
        if listener_configs and entity == zk.DEFAULT_BROKER_ENTITY:
            raise KafkaError(
                ErrorCode.invalid_request,
                "Cannot update these configs at default cluster level, broker id must be "
                f"specified: {', '.join(listener_configs)}",
            )
        # Kafka answers a broker config it cannot take with INVALID_REQUEST, whatever the
        # reason (a topic's with INVALID_CONFIG).
        log_configs = {k: v for k, v in configs.items() if k in DYNAMIC_LOG_CONFIGS}
        for prop, raw in log_configs.items():
            try:
                _parsed(prop, raw, DYNAMIC_LOG_CONFIGS[prop])
            except ValueError as e:
                raise KafkaError(ErrorCode.invalid_request, str(e)) from None
        own, cluster = self.layers()
        if entity == zk.DEFAULT_BROKER_ENTITY:
            cluster = configs
        else:
            own = configs
        # Checked as a tiered topic's configs are: Kafka's DynamicLogConfig holds the local
        # retention within the retention whether a topic tiers or not.
        defaults = self._log_defaults(own, cluster)
        try:
            tiered = {"remote.storage.enable": True, "cleanup.policy": "delete"}
            LogConfig.from_configs({**defaults, **tiered}).check()
        except KafkaError as e:
            raise KafkaError(ErrorCode.invalid_request, str(e.args[0])) from None
        if self.listeners is not None and entity != zk.DEFAULT_BROKER_ENTITY:
            try:
                self.listeners.check(configs)
                if configs == current and not validate_only:
                    self.listeners.reconfigure(configs)  # a key store file replaced in place
            except ValueError as e:
                raise KafkaError(ErrorCode.invalid_request, str(e)) from None
        if validate_only or configs == current:
            return
        path = zk.broker_config_path(entity)
        try:
            if configs:
                await put(self.store, path, zk.encode_config(configs))
            else:
                await self.store.delete(path)
        except NoNodeError:
            pass  # nothing was set: nothing to delete
        except StoreError as e:
            raise store_error(f"altering the broker configs of {entity}", e) from e
        if not await self.cache.wait_until(
            lambda: self.cache.broker_configs.get(entity, {}) == configs, timeout_s
        ):
            raise KafkaError(
                ErrorCode.request_timed_out, f"broker configs of {entity}: not seen in time"
            )


def _parsed(prop: str, raw: str, definition: ConfigDef) -> Any:
    return broker_default(prop, raw, definition, definition.synonyms[0].unit_ms)
