"""The SASL server state machine (Kafka's SaslServerAuthenticator): which requests it lets
in when, handshake and authentication outcomes, KIP-368 session lifetimes and
re-authentication, the metrics and failure log; and the listener settings it starts from."""

from __future__ import annotations

import time

import pytest

from tierbroker.broker.config.security_settings import SecuritySettings
from tierbroker.broker.security.principal import KafkaPrincipal
from tierbroker.broker.security.sasl.authenticator import (
    API_VERSIONS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SaslServerAuthenticator,
    SaslState,
)
from tierbroker.broker.security.sasl.mechanism import IllegalSaslStateError
from tierbroker.broker.security.sasl.scram import ScramMechanism
from tierbroker.broker.security.sasl.scram_client import ScramSaslClient
from tierbroker.broker.security.sasl.settings import SaslConfigError, for_listener
from tierbroker.protocol.errors import ErrorCode

PRODUCE = 0
JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="pw";'
SHA512 = ScramMechanism.SCRAM_SHA_512
CREDENTIALS = {"bob": SHA512.new_credential("bob-pw")}


class Recorder:
    """The socket server's metrics, as the authenticator reports to them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []
        self.failures: list[tuple[str, str | None]] = []

    def authenticated(self, listener: str, reauthentication: bool = False) -> None:
        self.events.append(("ok", listener, reauthentication))

    def authentication_failed(
        self,
        listener: str,
        address: str,
        reason: str,
        user: str | None = None,
        reauthentication: bool = False,
    ) -> None:
        self.events.append(("failed", listener, reauthentication))
        self.failures.append((address, user))


def authenticator(
    recorder: Recorder | None = None, properties: dict[str, str] | None = None
) -> SaslServerAuthenticator:
    security = SecuritySettings(
        {
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            **(properties or {}),
        }
    )
    settings = for_listener(
        "SASL_PLAINTEXT", security, lambda m, u: CREDENTIALS.get(u) if m is SHA512 else None
    )
    return SaslServerAuthenticator(settings, "10.0.0.1", recorder or Recorder())


async def test_api_versions_then_handshake_then_plain() -> None:
    recorder = Recorder()
    auth = authenticator(recorder)
    auth.admit(API_VERSIONS)
    assert auth.state is SaslState.HANDSHAKE
    auth.admit(SASL_HANDSHAKE)
    assert auth.handshake("PLAIN", 1) is ErrorCode.none
    auth.admit(SASL_AUTHENTICATE)
    result = await auth.authenticate(b"\0alice\0pw")
    assert result.error_code is ErrorCode.none and result.session_lifetime_ms == 0
    assert auth.complete and auth.principal == KafkaPrincipal("User", "alice")
    auth.admit(PRODUCE)
    assert recorder.events == [("ok", "SASL_PLAINTEXT", False)]


@pytest.mark.parametrize("state_requests", [[], [API_VERSIONS], [SASL_HANDSHAKE]])
def test_requests_before_authentication_close(state_requests: list[int]) -> None:
    recorder = Recorder()
    auth = authenticator(recorder)
    for api_key in state_requests:
        auth.admit(api_key)
        if api_key == SASL_HANDSHAKE:
            auth.handshake("PLAIN", 1)
    with pytest.raises(IllegalSaslStateError, match="Unexpected Kafka request of type 0"):
        auth.admit(PRODUCE)
    assert auth.failed
    with pytest.raises(IllegalSaslStateError):  # a pipelined request after it
        auth.admit(PRODUCE)
    assert recorder.events == [("failed", "SASL_PLAINTEXT", False)]  # counted once


def test_api_versions_only_once() -> None:
    auth = authenticator()
    auth.admit(API_VERSIONS)
    with pytest.raises(IllegalSaslStateError):
        auth.admit(API_VERSIONS)


async def test_unknown_mechanism_and_wrong_password_fail_and_are_counted() -> None:
    recorder = Recorder()
    auth = authenticator(recorder)
    assert auth.handshake("SCRAM-SHA-256", 1) is ErrorCode.unsupported_sasl_mechanism
    assert auth.failed
    auth = authenticator(recorder)
    auth.handshake("PLAIN", 1)
    result = await auth.authenticate(b"\0alice\0nope")
    assert result.error_code is ErrorCode.sasl_authentication_failed
    assert result.error_message == "Authentication failed: Invalid username or password"
    assert auth.failed
    assert recorder.events == [("failed", "SASL_PLAINTEXT", False)] * 2
    assert recorder.failures == [("10.0.0.1", None), ("10.0.0.1", "alice")]


async def test_scram_failure_message_does_not_tell_whether_the_user_exists() -> None:
    messages = []
    for user in ("bob", "ghost"):
        auth = authenticator()
        auth.handshake("SCRAM-SHA-512", 1)
        client = ScramSaslClient(SHA512, user, "wrong")
        first = await auth.authenticate(client.first_message())
        assert first.error_code is ErrorCode.none
        final = await auth.authenticate(client.final_message(first.auth_bytes))
        assert final.error_code is ErrorCode.sasl_authentication_failed
        messages.append(final.error_message)
    assert (
        messages[0]
        == messages[1]
        == (
            "Authentication failed during authentication due to invalid credentials with "
            "SASL mechanism SCRAM-SHA-512"
        )
    )


async def test_handshake_v0_takes_raw_tokens() -> None:
    auth = authenticator()
    auth.handshake("SCRAM-SHA-512", 0)
    assert auth.expects_raw_token
    client = ScramSaslClient(SHA512, "bob", "bob-pw")
    first = await auth.raw_token(client.first_message())
    client.verify(await auth.raw_token(client.final_message(first)))
    assert auth.complete and not auth.expects_raw_token
    auth = authenticator()
    auth.handshake("PLAIN", 0)
    with pytest.raises(IllegalSaslStateError, match="Invalid username or password"):
        await auth.raw_token(b"\0alice\0nope")


async def test_session_lifetime_and_reauthentication(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    auth = authenticator(recorder, {"connections.max.reauth.ms": "60000"})
    auth.handshake("PLAIN", 1)
    result = await auth.authenticate(b"\0alice\0pw")
    assert result.session_lifetime_ms == 60000
    # Re-authentication on the same connection keeps the principal ...
    auth.admit(SASL_HANDSHAKE)
    assert auth.handshake("PLAIN", 1) is ErrorCode.none
    auth.admit(SASL_AUTHENTICATE)
    assert (await auth.authenticate(b"\0alice\0pw")).error_code is ErrorCode.none
    assert auth.complete
    # ... and a session past its lifetime lets nothing in but a re-authentication.
    later = time.monotonic_ns() + 61_000 * 1_000_000
    monkeypatch.setattr(time, "monotonic_ns", lambda: later)
    with pytest.raises(IllegalSaslStateError, match="session expired"):
        auth.admit(PRODUCE)
    auth.admit(SASL_HANDSHAKE)
    assert recorder.events == [("ok", "SASL_PLAINTEXT", False), ("ok", "SASL_PLAINTEXT", True)]


async def test_reauthentication_cannot_change_principal_or_mechanism() -> None:
    users = 'x.Y required user_alice="pw" user_carol="pw";'
    auth = authenticator(None, {"listener.name.sasl_plaintext.plain.sasl.jaas.config": users})
    auth.handshake("PLAIN", 1)
    await auth.authenticate(b"\0alice\0pw")
    auth.handshake("PLAIN", 1)
    result = await auth.authenticate(b"\0carol\0pw")
    assert result.error_code is ErrorCode.sasl_authentication_failed
    assert "Cannot change principals" in (result.error_message or "")
    auth = authenticator()
    auth.handshake("PLAIN", 1)
    await auth.authenticate(b"\0alice\0pw")
    assert auth.handshake("SCRAM-SHA-512", 1) is ErrorCode.unsupported_sasl_mechanism


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({}, "GSSAPI \\(Kafka's default"),
        ({"sasl.enabled.mechanisms": "GSSAPI"}, "GSSAPI is not supported"),
        ({"sasl.enabled.mechanisms": "PLAIN"}, "PLAIN is enabled but no user"),
        (
            {"sasl.enabled.mechanisms": "PLAIN", "sasl.jaas.config": "x.Y required a=;"},
            "does not parse",
        ),
        (
            {"sasl.enabled.mechanisms": "SCRAM-SHA-256", "sasl.server.max.receive.size": "x"},
            "not a whole number",
        ),
    ],
)
def test_listener_settings_refuse_what_cannot_run(properties: dict[str, str], message: str) -> None:
    with pytest.raises(SaslConfigError, match=message):
        for_listener("SASL_SSL", SecuritySettings(properties), lambda m, u: None)
