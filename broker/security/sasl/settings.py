"""`SaslListenerSettings`: how one SASL listener authenticates, from Kafka's properties.

Read once at start-up (`for_listener`), so a mistake stops the broker with the property to
fix: `sasl.enabled.mechanisms` (Kafka's default, GSSAPI, is not implemented: it must be set),
a PLAIN listener without users in its `sasl.jaas.config`, a JAAS text that does not parse.
Per listener (`listener.name.<l>.<name>`) and, for `sasl.jaas.config` and
`connections.max.reauth.ms`, per mechanism (`listener.name.<l>.<mechanism>.<name>`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tierbroker.broker.config.security_settings import SecuritySettings
from tierbroker.broker.security.sasl.jaas import JaasConfigError, jaas_options, plain_users
from tierbroker.broker.security.sasl.jwks import JwksSettings, JwksValidator
from tierbroker.broker.security.sasl.mechanism import (
    GSSAPI,
    OAUTHBEARER,
    PLAIN,
    SUPPORTED_MECHANISMS,
    SaslServer,
)
from tierbroker.broker.security.sasl.oauthbearer import (
    OAuthBearerSaslServer,
    TokenValidator,
    UnsecuredJwsValidator,
)
from tierbroker.broker.security.sasl.plain import PlainSaslServer
from tierbroker.broker.security.sasl.scram import ScramMechanism
from tierbroker.broker.security.sasl.scram_server import CredentialLookup, ScramSaslServer

ENABLED_MECHANISMS = "sasl.enabled.mechanisms"
JAAS_CONFIG = "sasl.jaas.config"
MAX_RECEIVE_SIZE = "sasl.server.max.receive.size"
MAX_REAUTH_MS = "connections.max.reauth.ms"
FAILED_AUTHENTICATION_DELAY_MS = "connection.failed.authentication.delay.ms"
DEFAULT_MAX_RECEIVE_BYTES = 524288
DEFAULT_FAILED_AUTHENTICATION_DELAY_MS = 100
JWKS_URL = "sasl.oauthbearer.jwks.endpoint.url"


class SaslConfigError(ValueError):
    """A SASL property the broker cannot start with; the message names it."""


@dataclass(frozen=True, slots=True)
class SaslListenerSettings:
    listener: str
    mechanisms: tuple[str, ...]  # as enabled, in order: the handshake answers this list
    servers: Mapping[str, Callable[[], SaslServer]] = field(repr=False)
    max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES
    max_reauth_ms: Mapping[str, int] = field(default_factory=dict)  # by mechanism; 0: off
    failed_authentication_delay_ms: int = DEFAULT_FAILED_AUTHENTICATION_DELAY_MS

    def new_server(self, mechanism: str) -> SaslServer:
        return self.servers[mechanism]()


def for_listener(
    listener: str, security: SecuritySettings, scram_credentials: CredentialLookup
) -> SaslListenerSettings:
    """The SASL settings of `listener`; SaslConfigError names what is wrong."""
    text = security.get(ENABLED_MECHANISMS, listener)
    mechanisms = tuple(m.strip() for m in (text or GSSAPI).split(",") if m.strip())
    unsupported = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
    if unsupported or not mechanisms:
        default = "" if text else f" (Kafka's default, as {ENABLED_MECHANISMS} is not set)"
        raise SaslConfigError(
            f"listener {listener}: SASL mechanism {', '.join(unsupported) or 'none'}{default} "
            f"is not supported; set {ENABLED_MECHANISMS} (or listener.name."
            f"{listener.lower()}.{ENABLED_MECHANISMS}) to some of {', '.join(SUPPORTED_MECHANISMS)}"
        )
    servers: dict[str, Callable[[], SaslServer]] = {}
    for mechanism in mechanisms:
        servers[mechanism] = _server_factory(listener, mechanism, security, scram_credentials)
    return SaslListenerSettings(
        listener=listener,
        mechanisms=mechanisms,
        servers=servers,
        max_receive_bytes=_int(security, MAX_RECEIVE_SIZE, listener, DEFAULT_MAX_RECEIVE_BYTES),
        max_reauth_ms={m: _int(security, MAX_REAUTH_MS, listener, 0, m) for m in mechanisms},
        failed_authentication_delay_ms=_int(
            security, FAILED_AUTHENTICATION_DELAY_MS, None, DEFAULT_FAILED_AUTHENTICATION_DELAY_MS
        ),
    )


def _server_factory(
    listener: str, mechanism: str, security: SecuritySettings, credentials: CredentialLookup
) -> Callable[[], SaslServer]:
    scram = ScramMechanism.by_name(mechanism)
    if scram is not None:
        return lambda: ScramSaslServer(scram, credentials)
    options = _jaas(listener, mechanism, security)
    if mechanism == PLAIN:
        users = plain_users(options)
        if not users:
            raise SaslConfigError(
                f"listener {listener}: PLAIN is enabled but no user is configured: set "
                f"listener.name.{listener.lower()}.plain.{JAAS_CONFIG} with "
                f'user_<name>="<password>"'
            )
        return lambda: PlainSaslServer(users)
    assert mechanism == OAUTHBEARER
    validator = _token_validator(listener, security, options)
    return lambda: OAuthBearerSaslServer(validator)


def _token_validator(
    listener: str, security: SecuritySettings, options: Mapping[str, str]
) -> TokenValidator:
    url = security.get(JWKS_URL, listener, OAUTHBEARER)
    if not url:
        return UnsecuredJwsValidator.from_jaas_options(options)

    def get(name: str) -> str | None:
        return security.get(f"sasl.oauthbearer.{name}", listener, OAUTHBEARER)

    audience = get("expected.audience") or ""
    return JwksValidator(
        JwksSettings(
            url=url,
            refresh_ms=_int(
                security, "sasl.oauthbearer.jwks.endpoint.refresh.ms", listener, 3_600_000
            ),
            expected_audience=tuple(a.strip() for a in audience.split(",") if a.strip()),
            expected_issuer=get("expected.issuer") or None,
            clock_skew_s=_int(security, "sasl.oauthbearer.clock.skew.seconds", listener, 30),
            sub_claim_name=get("sub.claim.name") or "sub",
        )
    )


def _jaas(listener: str, mechanism: str, security: SecuritySettings) -> dict[str, str]:
    text = security.get(JAAS_CONFIG, listener, mechanism)
    if not text:
        return {}
    try:
        return jaas_options(text)
    except JaasConfigError as e:
        raise SaslConfigError(
            f"listener {listener}: {JAAS_CONFIG} of {mechanism} does not parse: {e}"
        ) from None


def _int(
    security: SecuritySettings,
    name: str,
    listener: str | None,
    default: int,
    mechanism: str | None = None,
) -> int:
    text = security.get(name, listener, mechanism)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SaslConfigError(f"{name}={text!r} is not a whole number") from None
    if value < 0:
        raise SaslConfigError(f"{name}={value} must not be negative")
    return value
