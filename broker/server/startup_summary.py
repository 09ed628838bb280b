"""The lines a broker logs at INFO once it serves: what runs, where, and what was configured.

Version, each listener bound and the address it advertises, the metrics endpoint, the
log dirs, the remote tier and its plugins, then every setting that differs from its
default (secrets hidden, as Kafka prints `[hidden]`) and the Kafka configs that were
accepted but have no effect in tierbroker.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from tierbroker.broker.config.broker_config import BrokerConfig
from tierbroker.broker.config.security_settings import is_secret
from tierbroker.broker.network.endpoints import BrokerEndpoints
from tierbroker.broker.server.preflight import BoundPorts
from tierbroker.broker.server.remote_storage import STORAGE_MANAGERS, local_remote_dir
from tierbroker.storage.topic_configs import TOPIC_CONFIGS, format_value

HIDDEN = "[hidden]"


def tierbroker_version() -> str:
    try:
        return version("tierbroker")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def startup_summary(
    config: BrokerConfig, endpoints: BrokerEndpoints, cluster_id: str, ports: BoundPorts
) -> list[str]:
    """The summary's lines; `ports` are the sockets bound."""
    bound = {name: _address(sock.getsockname()) for name, sock in ports.listeners.items()}
    metrics_host = next(iter(bound.values())).rpartition(":")[0]
    metrics = (
        f"metrics on http://{metrics_host}:{endpoints.metrics_port}/metrics"
        if endpoints.metrics_port is not None
        else "no metrics endpoint (metrics.port=-1)"
    )
    listeners = ", ".join(
        f"{x.name} ({x.security_protocol}) on {bound[x.name]}, advertised as "
        f"{_address((x.host, x.port))}"
        for x in endpoints.listeners
    )
    lines = [
        f"tierbroker {tierbroker_version()}: broker {config.broker_id} of cluster {cluster_id}",
        f"listening: {listeners}; inter-broker listener "
        f"{config.listener_config.inter_broker}; {metrics}",
        f"log dirs: {', '.join(str(d.absolute()) for d in config.log_dir_paths)}",
        f"remote tier: {_remote_tier(config)}",
        f"non-default settings: {', '.join(non_default_settings(config)) or 'none'}",
    ]
    if config.ignored_properties:
        lines.append(
            "Kafka configs without effect in tierbroker (ignored): "
            + ", ".join(config.ignored_properties)
        )
    return lines


def _remote_tier(config: BrokerConfig) -> str:
    if not config.remote_log_storage_system_enable:
        return "off (remote.log.storage.system.enable=false)"
    name = config.remote_log_storage_manager_class_name
    storage = f"{name} ({STORAGE_MANAGERS[name]})" if name in STORAGE_MANAGERS else name
    where = ""
    if name == "localfs":
        where = f" in {local_remote_dir(config).absolute()}"
    elif "storage.s3.bucket.name" in config.rsm_configs:
        where = f" in bucket {config.rsm_configs['storage.s3.bucket.name']}"
    metadata = config.remote_log_metadata_manager_class_name
    return f"storage {storage}{where}, metadata {metadata}"


def non_default_settings(config: BrokerConfig) -> list[str]:
    """`name=value` for each property set to other than its default, sorted by name."""
    values: dict[str, Any] = config.model_dump(by_alias=True, exclude_defaults=True)
    for name, value in config.log_defaults.items():  # topic defaults, as set
        definition = TOPIC_CONFIGS[name]
        if value != definition.default:
            synonyms = (s.name for s in definition.synonyms)
            values.update({s: v for s in synonyms if (v := config.log_default_synonyms.get(s))})
    for prefix, plugin_configs in (
        ("rsm.config.", config.rsm_configs),
        ("rlmm.config.", config.rlmm_configs),
    ):
        values.update({prefix + k: v for k, v in plugin_configs.items()})
    values.update(config.security.values)
    return [f"{k}={_shown(k, v)}" for k, v in sorted(values.items())]


def _shown(name: str, value: Any) -> str:
    if is_secret(name):
        return HIDDEN
    return format_value(value)


def _address(address: tuple[Any, ...]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
