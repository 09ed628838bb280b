"""Kafka's listeners: `listeners`, `advertised.listeners`, `listener.security.protocol.map`
and the inter-broker listener (`inter.broker.listener.name` or
`security.inter.broker.protocol`), parsed and checked together.

A listener is a name, a security protocol and an address. Its name is the part before
`://`; unless the protocol map says otherwise, the four protocol names stand for
themselves. Every listener must be advertised (a listener missing from
`advertised.listeners` is advertised with its own address, a wildcard host as
127.0.0.1), and the inter-broker listener must be one of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

MAX_PORT = 65535
_HOST = re.compile(r"[0-9A-Za-z\-%._:]*")
_NAME = re.compile(r"[A-Za-z0-9_]+")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class ListenerError(ValueError):
    """A listener setting that cannot be used; the message names the property."""


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True, slots=True)
class Listener:
    """One endpoint: `name` as configured (upper case), its protocol, host and port (0: any
    free port, then the one bound)."""

    name: str
    security_protocol: SecurityProtocol
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"

    def with_port(self, port: int) -> Listener:
        return Listener(self.name, self.security_protocol, self.host, port)


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """What to bind (`listeners`), what to tell clients (`advertised`, one per listener,
    same order) and which listener brokers use between themselves."""

    listeners: tuple[Listener, ...]
    advertised: tuple[Listener, ...]
    inter_broker: str
    protocol_map: dict[str, SecurityProtocol]

    def listener(self, name: str) -> Listener:
        return next(x for x in self.listeners if x.name == name)

    def advertised_for(self, name: str) -> Listener:
        return next(x for x in self.advertised if x.name == name)


def parse_protocol_map(value: str | None) -> dict[str, SecurityProtocol]:
    """`NAME:PROTOCOL,...`; unset, the four protocols map to themselves."""
    if value is None:
        return {p.value: p for p in SecurityProtocol}
    result: dict[str, SecurityProtocol] = {}
    for entry in (e.strip() for e in value.split(",") if e.strip()):
        name, sep, protocol = entry.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not _NAME.fullmatch(name) or protocol not in SecurityProtocol.__members__:
            raise ListenerError(
                f"listener.security.protocol.map={value!r}: {entry!r} should be NAME:PROTOCOL "
                f"with PROTOCOL one of {', '.join(SecurityProtocol)}"
            )
        if name in result:
            raise ListenerError(f"listener.security.protocol.map={value!r}: {name} is mapped twice")
        result[name] = SecurityProtocol(protocol)
    return result


def parse_listener_list(
    value: str, prop: str, protocol_map: dict[str, SecurityProtocol]
) -> tuple[Listener, ...]:
    """`NAME://host:port,...` with each name in `protocol_map`, no name or port twice."""
    listeners: list[Listener] = []
    for entry in (e.strip() for e in value.split(",") if e.strip()):
        name, sep, address = entry.partition("://")
        host, colon, port_text = address.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not colon or not port_text.isdigit() or not _HOST.fullmatch(host):
            raise ListenerError(f"{prop}={value!r}: {entry!r} should be NAME://host:port")
        name = name.upper()
        if name not in protocol_map:
            raise ListenerError(
                f"{prop}={value!r}: listener {name} has no security protocol: use one of "
                f"{', '.join(SecurityProtocol)} as its name, or map it in "
                "listener.security.protocol.map"
            )
        port = int(port_text)
        if port > MAX_PORT:
            raise ListenerError(
                f"{prop}={value!r}: port {port} is out of range: use 1 to {MAX_PORT}, "
                "or 0 for a free port"
            )
        if any(x.name == name for x in listeners):
            raise ListenerError(f"{prop}={value!r}: listener {name} is given twice")
        if port and any(x.port == port for x in listeners):
            raise ListenerError(f"{prop}={value!r}: port {port} is given twice")
        listeners.append(Listener(name, protocol_map[name], host, port))
    if not listeners:
        raise ListenerError(f"{prop}={value!r}: give at least one NAME://host:port")
    return tuple(listeners)


def parse_listener_config(
    listeners: str,
    advertised_listeners: str | None,
    protocol_map: str | None,
    inter_broker_listener_name: str | None,
    security_inter_broker_protocol: str | None,
) -> ListenerConfig:
    """The listeners, checked together; `ListenerError` names the property to fix."""
    mapping = parse_protocol_map(protocol_map)
    bound = parse_listener_list(listeners, "listeners", mapping)
    told = (
        parse_listener_list(advertised_listeners, "advertised.listeners", mapping)
        if advertised_listeners is not None
        else ()
    )
    for x in told:
        if x.host in WILDCARD_HOSTS:
            raise ListenerError(
                f"advertised.listeners={advertised_listeners!r}: clients cannot connect to "
                f"the wildcard address of {x.name}: advertise a host name or an address"
            )
        if not any(b.name == x.name for b in bound):
            raise ListenerError(
                f"advertised.listeners={advertised_listeners!r}: {x.name} is not one of "
                f"listeners={listeners!r}"
            )
    advertised = tuple(
        next((x for x in told if x.name == b.name), None)
        or Listener(b.name, b.security_protocol, _reachable(b.host), b.port)
        for b in bound
    )
    inter_broker = _inter_broker_name(
        bound, inter_broker_listener_name, security_inter_broker_protocol
    )
    return ListenerConfig(bound, advertised, inter_broker, mapping)


def _reachable(host: str) -> str:
    return "127.0.0.1" if host in WILDCARD_HOSTS else host


def _inter_broker_name(
    listeners: tuple[Listener, ...], name: str | None, protocol: str | None
) -> str:
    if name is not None and protocol is not None:
        raise ListenerError(
            "inter.broker.listener.name and security.inter.broker.protocol are both set: "
            "set only one"
        )
    if name is not None:
        wanted = name.strip().upper()
        if not any(x.name == wanted for x in listeners):
            raise ListenerError(
                f"inter.broker.listener.name={name!r} is not one of the listeners "
                f"({', '.join(x.name for x in listeners)})"
            )
        return wanted
    # Kafka's default: the listener named PLAINTEXT.
    wanted = (protocol or SecurityProtocol.PLAINTEXT.value).strip().upper()
    if wanted not in SecurityProtocol.__members__:
        raise ListenerError(
            f"security.inter.broker.protocol={protocol!r}: use one of {', '.join(SecurityProtocol)}"
        )
    if not any(x.name == wanted for x in listeners):
        raise ListenerError(
            f"security.inter.broker.protocol={wanted}: no listener is named {wanted}: "
            "add it to listeners, or name the inter-broker listener with "
            "inter.broker.listener.name (or security.inter.broker.protocol)"
        )
    return wanted
