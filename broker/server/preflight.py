"""Checks made before the broker touches the disk; each refuses the start with one line.

`load_config` has already checked every value on its own; these checks need the
machine: the log dirs (each an existing writable directory, or one that can be
created), the remote tier's plugins (their classes load; the built-in ones' required
`rsm.config.*` settings are there and valid), the replica selector's class, the TLS
listeners' key and trust stores (`check_tls`), the authorizer (`authorizer.class.name`,
`super.users`), the directory of the ports file, and the ports. Each broker's listeners and metrics
endpoint are bound here but not yet listened on, so a port in use is found before
anything is written, and a port of 0 is already the free port the broker will
advertise. Every failure is a `ConfigError`
whose message names the property and the fix.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from tierbroker.broker.config.broker_config import BrokerConfig, ConfigError, Endpoint
from tierbroker.broker.replication.replica_selector import selector_class
from tierbroker.broker.security.authorizer.authorizer import AuthorizerConfig
from tierbroker.broker.server.listener_sasl import check_sasl
from tierbroker.broker.server.listener_security import check_tls
from tierbroker.broker.server.remote_storage import (
    STORAGE_MANAGERS,
    chunk_cache_config,
    local_remote_dir,
    metadata_manager_class,
    storage_manager_class,
)
from tierbroker.storage.remote.segment_codec import TransformConfig
from tierbroker.storage.remote.storage_manager import RemoteStorageManager
from tierbroker.storage.topic_partition import TopicPartition

# The built-in plugins' settings that have no default (the `rsm.config.` prefix removed).
REQUIRED_SETTINGS = {"s3": ("storage.s3.bucket.name",)}
# The S3 plugin's settings, to give its messages their full property names.
# A plugin's setting named in its message, to be shown with its `rsm.config.` prefix.
_RSM_SETTING = re.compile(
    r"(?<![\w.])((?:storage|key|encryption|compression|chunk|fetch|segment)\.[a-z0-9.]*[a-z0-9])"
)


@dataclass(slots=True)
class BoundPorts:
    """A broker's listening sockets (one per listener, in `listeners` order) and its metrics
    endpoint's, bound and not listening; the port numbers stay known once the sockets are
    closed (a restart binds them again)."""

    listeners: dict[str, socket.socket]
    metrics: socket.socket | None
    listener_ports: dict[str, int] = field(init=False)
    metrics_port: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.listener_ports = {n: int(s.getsockname()[1]) for n, s in self.listeners.items()}
        self.metrics_port = None if self.metrics is None else int(self.metrics.getsockname()[1])

    @property
    def port(self) -> int:
        """The first listener's port: where clients of a one-listener broker connect."""
        return next(iter(self.listener_ports.values()))

    def close(self) -> None:
        for sock in self.listeners.values():
            sock.close()
        if self.metrics is not None:
            self.metrics.close()


def preflight(configs: list[BrokerConfig], ports_file: Path | None = None) -> list[BoundPorts]:
    """Check what the brokers of `configs` (one process's, as `broker_configs` makes them)
    need from the machine and bind their ports; `ConfigError` (nothing bound, nothing
    written) if something is missing."""
    for config in configs:
        for log_dir in config.log_dir_paths:
            check_writable_dir(log_dir, "log.dirs")
        check_tls(config)
        check_sasl(config)
    if configs[0].remote_log_storage_system_enable:  # the brokers' plugins are the same
        check_remote_tier(configs[0])
    if configs[0].replica_selector_class:
        try:
            selector_class(configs[0].replica_selector_class)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    try:
        AuthorizerConfig.from_properties(configs[0].security.values)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if ports_file is not None:
        parent = Path(os.path.abspath(ports_file)).parent
        if not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
            raise ConfigError(
                f"--ports-file {ports_file}: {parent} is not a writable directory: "
                "name a file in one"
            )
    return bind_all(configs)


def bind_all(configs: list[BrokerConfig]) -> list[BoundPorts]:
    """The ports of every broker of `configs`, or none (`ConfigError` if one is taken)."""
    bound: list[BoundPorts] = []
    try:
        for config in configs:
            bound.append(bind_ports(config))
    except ConfigError:
        for ports in bound:
            ports.close()
        raise
    return bound


def check_writable_dir(path: Path, prop: str) -> None:
    """`path` is a directory this process may write in, or can be created as one."""
    path = Path(os.path.abspath(path))
    fix = f"set {prop} to a directory this user can write"
    try:
        if path.exists():
            if not path.is_dir():
                raise ConfigError(f"{prop}: {path} is not a directory: {fix}")
            if not os.access(path, os.W_OK | os.X_OK):
                raise ConfigError(f"{prop}: {path} is not writable: {fix}")
            return
        ancestor = path.parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise ConfigError(
                f"{prop}: {path} cannot be created: {ancestor} is not a directory: {fix}"
            )
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ConfigError(
                f"{prop}: {path} cannot be created in {ancestor}, which is not writable: {fix}"
            )
        _try_create(path, ancestor)
    except OSError as e:
        raise ConfigError(f"{prop}: {path} cannot be used ({e.strerror}): {fix}") from None


def _try_create(path: Path, ancestor: Path) -> None:
    """Create `path` below its existing `ancestor` and remove what was created: root passes
    `os.access` everywhere, yet a file system such as procfs still refuses a new entry."""
    created: list[Path] = []
    try:
        for missing in reversed(path.relative_to(ancestor).parents[:-1]):
            (ancestor / missing).mkdir()
            created.append(ancestor / missing)
        path.mkdir()
        created.append(path)
    finally:
        for made in reversed(created):
            made.rmdir()


def check_remote_tier(config: BrokerConfig) -> None:
    """The plugins load, and the built-in storage plugins have what they need."""
    rsm_class = storage_manager_class(config)
    metadata_manager_class(config)
    chunk_cache_config(config)
    try:  # the built-in plugins' compression and encryption, and any reader's keys
        TransformConfig.from_configs(config.rsm_configs)
    except ValueError as e:
        raise ConfigError(_RSM_SETTING.sub(r"rsm.config.\1", str(e))) from None
    builtin = _builtin_base(rsm_class)
    name = config.remote_log_storage_manager_class_name
    for setting in REQUIRED_SETTINGS.get(builtin or "", ()):
        if not config.rsm_configs.get(setting):
            raise ConfigError(
                f"rsm.config.{setting} is required by remote.log.storage.manager.class.name="
                f"{name}: set it, or turn the remote tier off with "
                "remote.log.storage.system.enable=false"
            )
    if builtin == "localfs":
        _check_local_remote_dir(config)
    elif f"{rsm_class.__module__}.{rsm_class.__qualname__}" == STORAGE_MANAGERS["s3"]:
        try:  # the S3 plugin's configure() only reads its settings (a subclass's may not)
            rsm_class().configure(config.rsm_configs)
        except ValueError as e:
            message = _RSM_SETTING.sub(r"rsm.config.\1", str(e))
            raise ConfigError(f"remote.log.storage.manager.class.name={name}: {message}") from None


def _builtin_base(rsm_class: type[RemoteStorageManager]) -> str | None:
    """`localfs` or `s3` if `rsm_class` is (or extends) that built-in plugin; found by
    name, so checking does not import the S3 plugin's dependencies."""
    by_path = {path: short for short, path in STORAGE_MANAGERS.items()}
    for cls in rsm_class.__mro__:
        short = by_path.get(f"{cls.__module__}.{cls.__qualname__}")
        if short is not None:
            return short
    return None


def _check_local_remote_dir(config: BrokerConfig) -> None:
    """A LocalFs dir inside a log dir must not be named like a partition, which loading the
    log dir would take for one of a deleted topic and remove. (A dir that cannot be
    written is the remote store's health, a warning: the local tier serves without it.)"""
    remote_dir = Path(os.path.abspath(local_remote_dir(config)))
    try:
        TopicPartition.from_dir_name(remote_dir.name)
    except ValueError:
        return
    if remote_dir.parent in {Path(os.path.abspath(d)) for d in config.log_dir_paths}:
        raise ConfigError(
            f"rsm.config.dir={remote_dir}: inside a log dir, a name of the form "
            "<topic>-<partition> would be loaded as a partition: choose another name"
        )


def bind_ports(config: BrokerConfig) -> BoundPorts:
    """Bind each listener's port and the metrics port (`ConfigError` if one is taken)."""
    listeners = config.listener_config.listeners
    setting = f"listeners={config.listeners!r}"
    if config.metrics_port > 0 and any(x.port == config.metrics_port for x in listeners):
        raise ConfigError(
            f"metrics.port={config.metrics_port}: a listener uses that port "
            f"({setting}): give the metrics endpoint another port"
        )
    bound: dict[str, socket.socket] = {}
    try:
        for x in listeners:
            bound[x.name] = _bind(Endpoint(x.host, x.port), setting)
        metrics = None
        if config.metrics_port >= 0:
            metrics = _bind(
                Endpoint(listeners[0].host, config.metrics_port),
                f"metrics.port={config.metrics_port}",
            )
    except ConfigError:
        for sock in bound.values():
            sock.close()
        raise
    return BoundPorts(bound, metrics)


def _bind(endpoint: Endpoint, setting: str) -> socket.socket:
    """A TCP socket bound to `endpoint`, not listening: host "" is every IPv4 interface; a
    name is bound to its IPv4 address when it has one (`localhost`: 127.0.0.1, not ::1)."""
    host, port = endpoint
    try:
        if host:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            ipv4 = [a for a in found if a[0] == socket.AF_INET]
            family, kind, proto, _, address = (ipv4 or found)[0]
        else:
            family, kind, proto, address = socket.AF_INET, socket.SOCK_STREAM, 0, ("", port)
    except socket.gaierror as e:
        raise ConfigError(
            f"{setting}: cannot resolve {host!r} ({e.strerror}): "
            "use a host name or an address of this machine"
        ) from None
    try:
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ConfigError(f"{setting}: {_bind_failure(e, host or '0.0.0.0', port)}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ConfigError(f"{setting}: {_bind_failure(e, host or '0.0.0.0', port)}") from None
    return sock


def _bind_failure(e: OSError, host: str, port: int) -> str:
    if e.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use by another process: stop it, "
            "or choose another port (0 picks a free one)"
        )
    if e.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine: use one of its addresses"
    if e.errno == errno.EACCES:
        return f"binding port {port} was refused (ports below 1024 need privileges)"
    return f"cannot bind {host}:{port} ({e.strerror})"
