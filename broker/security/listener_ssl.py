"""`ListenerSsl`: the TLS of the broker's listeners, reloadable without a restart.

Each TLS listener has a server context (`ssl_factory.server_context`) and a principal
builder (its `ssl.principal.mapping.rules`); the socket server asks `context_for` for
each new connection, so a reload serves new connections while existing ones keep the
context they were accepted with.

A reload is Kafka's dynamic update of a listener's key store or trust store: the
properties of `RECONFIGURABLE_CONFIGS`, set for this broker (IncrementalAlterConfigs on
broker N, as `listener.name.<l>.ssl.keystore.location=...` or unprefixed), over the
static ones. `check` builds what would change and refuses, as Kafka's `SslFactory`
does, a key store whose certificate has another subject (unless `ssl.allow.dn.changes`)
or other subject alternative names (unless `ssl.allow.san.changes`), a trust store
added where there was none, and on the inter-broker listener a key store its trust
store does not verify (a handshake in memory, both ways between the old and the new).
The same values with a key store file changed in place reload it too, as in Kafka.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tierbroker.broker.config.broker_config import ConfigError
from tierbroker.broker.config.listeners import Listener
from tierbroker.broker.config.security_settings import LISTENER_PREFIX, SecuritySettings
from tierbroker.broker.security.distinguished_name import distinguished_name
from tierbroker.broker.security.principal import KafkaPrincipal
from tierbroker.broker.security.ssl_factory import ServerSsl, client_context, server_context
from tierbroker.broker.security.ssl_principal import SslPrincipalBuilder, SslPrincipalMapper
from tierbroker.broker.security.ssl_stores import StoreSettings, modified_ns, subject_alt_names

log = logging.getLogger(__name__)

# Kafka's SslConfigs.RECONFIGURABLE_CONFIGS.
RECONFIGURABLE_CONFIGS = frozenset(
    {
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.key.password",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.password",
        "ssl.truststore.certificates",
    }
)
HANDSHAKE_ROUNDS = 16


def is_reconfigurable(name: str) -> bool:
    """`name` (or `listener.name.<l>.<name>`) is a TLS store property a reload may change."""
    if name.startswith(LISTENER_PREFIX):
        name = name[len(LISTENER_PREFIX) :].partition(".")[2]
    return name in RECONFIGURABLE_CONFIGS


@dataclass(frozen=True, slots=True)
class _Built:
    """A listener's server context, the settings it was built from, and the modification
    times of the store files it read."""

    ssl: ServerSsl
    settings: StoreSettings
    stamps: tuple[int, ...]

    def files(self) -> tuple[str, ...]:
        trust = self.ssl.truststore
        return self.ssl.keystore.files + (trust.files if trust else ())

    def files_unchanged(self) -> bool:
        return modified_ns(self.files()) == self.stamps


class ListenerSsl:
    """The server contexts and principal builders of the TLS listeners of `listeners`;
    `ConfigError` for settings that cannot serve."""

    def __init__(
        self, settings: SecuritySettings, listeners: Sequence[Listener], inter_broker: str
    ) -> None:
        self.settings = settings
        self.inter_broker = inter_broker
        self._built: dict[str, _Built] = {}
        self._principals: dict[str, SslPrincipalBuilder] = {}
        for listener in (x for x in listeners if x.security_protocol.uses_tls):
            self._built[listener.name] = self._build(self._store_settings(listener.name, {}))
            rules = StoreSettings(settings, listener.name)
            try:
                mapper = SslPrincipalMapper(rules.get("ssl.principal.mapping.rules"))
            except ValueError as e:
                raise ConfigError(f"{rules.prop('ssl.principal.mapping.rules')}: {e}") from None
            self._principals[listener.name] = SslPrincipalBuilder(mapper)

    def context_for(self, listener: Listener) -> ssl.SSLContext | None:
        """The context new connections to `listener` are served with; None: no TLS."""
        built = self._built.get(listener.name)
        return None if built is None else built.ssl.context

    def principal(
        self, listener: Listener, ssl_object: ssl.SSLObject | ssl.SSLSocket | None
    ) -> KafkaPrincipal:
        """The principal of a connection to TLS `listener` (`NoMatchingRule` if none)."""
        return self._principals[listener.name].principal(ssl_object)

    def check(self, dynamic: Mapping[str, str]) -> None:
        """`ConfigError` if `dynamic` (this broker's dynamic configs) gives a listener
        stores it cannot take."""
        self._changes(dynamic)

    def reconfigure(self, dynamic: Mapping[str, str]) -> None:
        """Serve new connections with the stores `dynamic` gives; `ConfigError` (and
        nothing changed) if a listener cannot take them."""
        changed = self._changes(dynamic)
        self._built.update(changed)
        for name, built in changed.items():
            cert = built.ssl.keystore.chain[0]
            log.info(
                "listener %s: TLS stores reloaded for new connections (%s, valid until %s)",
                name,
                distinguished_name(cert),
                cert.not_valid_after_utc.isoformat(),
            )

    def _changes(self, dynamic: Mapping[str, str]) -> dict[str, _Built]:
        """The listeners whose store settings or store files changed, rebuilt and checked."""
        changed = {}
        for name, old in self._built.items():
            settings = self._store_settings(name, dynamic)
            if _store_values(settings) == _store_values(old.settings) and old.files_unchanged():
                continue
            new = self._build(settings)
            _check_compatible(settings, old.ssl, new.ssl)
            if name == self.inter_broker:
                _check_verifiable(old, new)
            changed[name] = new
        return changed

    def _store_settings(self, listener: str, dynamic: Mapping[str, str]) -> StoreSettings:
        """The listener's settings with `dynamic` over the static ones (a dynamic value,
        prefixed or not, replaces the static values of its property)."""
        values = dict(self.settings.values)
        for name, value in dynamic.items():
            if is_reconfigurable(name):
                values[name] = value
        return StoreSettings(SecuritySettings(values), listener)

    @staticmethod
    def _build(settings: StoreSettings) -> _Built:
        built = server_context(settings)
        files = built.keystore.files + (built.truststore.files if built.truststore else ())
        return _Built(built, settings, modified_ns(files))


def _store_values(settings: StoreSettings) -> dict[str, str | None]:
    return {name: settings.get(name) for name in sorted(RECONFIGURABLE_CONFIGS)}


def _check_compatible(settings: StoreSettings, old: ServerSsl, new: ServerSsl) -> None:
    """Kafka's `CertificateEntries.ensureCompatible`, and no trust store out of nothing."""
    where = f"listener {settings.listener}"
    old_cert, new_cert = old.keystore.chain[0], new.keystore.chain[0]
    old_dn, new_dn = distinguished_name(old_cert), distinguished_name(new_cert)
    if old_dn != new_dn and not _allowed(settings, "ssl.allow.dn.changes"):
        raise ConfigError(
            f"{where}: the new key store's certificate is {new_dn}, the current one's "
            f"{old_dn}: keep the subject, or set ssl.allow.dn.changes=true"
        )
    old_sans, new_sans = subject_alt_names(old_cert), subject_alt_names(new_cert)
    if old_sans != new_sans and not _allowed(settings, "ssl.allow.san.changes"):
        raise ConfigError(
            f"{where}: the new key store's subject alternative names are {list(new_sans)}, the "
            f"current one's {list(old_sans)}: keep them, or set ssl.allow.san.changes=true"
        )
    if old.truststore is None and new.truststore is not None:
        raise ConfigError(
            f"{where}: a trust store cannot be added to a listener that started without one"
        )


def _allowed(settings: StoreSettings, name: str) -> bool:
    return (settings.get(name) or "false").strip().lower() == "true"


def _check_verifiable(old: _Built, new: _Built) -> None:
    """Brokers still on the old stores and this one on the new must still talk: each
    server context completes a handshake with the other's client context (Kafka's
    `SslEngineValidator`; the certificates are checked, not the host names)."""
    try:
        _handshake(old.ssl.context, _client(new.settings))
        _handshake(new.ssl.context, _client(old.settings))
    except ssl.SSLError as e:
        raise ConfigError(
            f"listener {new.settings.listener} is the inter-broker listener, and its new stores "
            f"and the current ones do not verify each other ({e.reason or e}): both trust "
            "stores must hold the CA of the other's certificate"
        ) from None


def _client(settings: StoreSettings) -> ssl.SSLContext:
    context = client_context(settings)
    context.check_hostname = False
    return context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """A TLS handshake between `server` and `client` through memory; SSLError if refused."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server_end = server.wrap_bio(s_in, s_out, server_side=True)
    client_end = client.wrap_bio(c_in, c_out)
    done = set()
    for _ in range(HANDSHAKE_ROUNDS):
        for end in (client_end, server_end):
            if end not in done:
                try:
                    end.do_handshake()
                    done.add(end)
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if len(done) == 2:
            return
    raise ssl.SSLError("the handshake did not complete")
