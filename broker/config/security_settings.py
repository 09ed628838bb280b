"""`SecuritySettings`: the broker's TLS, SASL and authorizer properties, as given.

They keep Kafka's names and are read where they are used (`broker.security`), through
`get`, which applies Kafka's per-listener overrides: `listener.name.<listener>.<name>`
(the listener in lower case) before `<name>`; for `sasl.jaas.config` the mechanism is
part of the name too (`listener.name.<listener>.<mechanism>.sasl.jaas.config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

LISTENER_PREFIX = "listener.name."
# Kafka's PASSWORD-type properties (any `*.password` too), and the plugins' secrets (under
# `rsm.config.` and `rlmm.config.`): never logged, shown or described with their value.
SECRET_NAMES = frozenset(
    {
        "ssl.keystore.password",
        "ssl.key.password",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
        "ssl.truststore.password",
        "ssl.truststore.certificates",
        "sasl.jaas.config",
        "delegation.token.secret.key",
        "storage.aws.secret.access.key",
    }
)
PLUGIN_PREFIXES = ("rsm.config.", "rlmm.config.")
# A plugin's setting named so is taken for a secret whatever its plugin.
_SECRET_WORDS = ("password", "secret", "credentials")

# Kafka's security properties that tierbroker implements (the rest of Kafka's are noted
# as ignored when set).
SECURITY_CONFIG_NAMES = frozenset(
    """
    listener.security.protocol.map inter.broker.listener.name security.inter.broker.protocol
    ssl.keystore.type ssl.keystore.location ssl.keystore.password ssl.key.password
    ssl.keystore.certificate.chain ssl.keystore.key ssl.truststore.type ssl.truststore.location
    ssl.truststore.password ssl.truststore.certificates ssl.client.auth ssl.enabled.protocols
    ssl.protocol ssl.cipher.suites ssl.endpoint.identification.algorithm
    ssl.principal.mapping.rules ssl.allow.dn.changes ssl.allow.san.changes
    sasl.enabled.mechanisms sasl.mechanism.inter.broker.protocol sasl.jaas.config
    sasl.server.max.receive.size connections.max.reauth.ms
    connection.failed.authentication.delay.ms
    sasl.oauthbearer.jwks.endpoint.url sasl.oauthbearer.jwks.endpoint.refresh.ms
    sasl.oauthbearer.expected.audience sasl.oauthbearer.expected.issuer
    sasl.oauthbearer.clock.skew.seconds sasl.oauthbearer.sub.claim.name
    sasl.oauthbearer.scope.claim.name
    authorizer.class.name super.users allow.everyone.if.no.acl.found
    """.split()
)


def is_secret(name: str) -> bool:
    """A property whose value is never shown (`listener.name.*` overrides of one too)."""
    return (
        name.endswith(".password")
        or any(name == s or name.endswith("." + s) for s in SECRET_NAMES)
        or (name.startswith(PLUGIN_PREFIXES) and any(w in name for w in _SECRET_WORDS))
    )


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """Security properties as configured, `listener.name.*` overrides included."""

    values: Mapping[str, str] = field(default_factory=dict)

    def get(
        self, name: str, listener: str | None = None, mechanism: str | None = None
    ) -> str | None:
        """`name` for `listener` (an override wins), else the broker-wide value, else None."""
        if listener is not None:
            prefix = f"{LISTENER_PREFIX}{listener.lower()}."
            if mechanism is not None:
                found = self.values.get(f"{prefix}{mechanism.lower()}.{name}")
                if found is not None:
                    return found
            found = self.values.get(prefix + name)
            if found is not None:
                return found
        return self.values.get(name)

    def redacted(self) -> dict[str, str]:
        """Every value, secrets shown as `[hidden]` (for logs and summaries)."""
        return {k: "[hidden]" if is_secret(k) else v for k, v in self.values.items()}
