"""SASL mechanisms against their specifications: JAAS parsing as Kafka's JaasConfig, PLAIN
(RFC 4616), SCRAM-SHA-256 against RFC 7677's exchange and SHA-512 against our own client,
OAUTHBEARER's unsecured JWS rules (Kafka's OAuthBearerUnsecuredJws) and signed tokens
against a JWKS."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tierbroker.broker.security.sasl import scram_server
from tierbroker.broker.security.sasl.jaas import (
    JaasConfigError,
    jaas_options,
    parse_jaas_config,
    plain_users,
)
from tierbroker.broker.security.sasl.jwks import JwksSettings, JwksValidator
from tierbroker.broker.security.sasl.mechanism import (
    IllegalSaslStateError,
    InvalidCredentialsError,
    SaslAuthenticationError,
)
from tierbroker.broker.security.sasl.oauthbearer import (
    InvalidTokenError,
    OAuthBearerSaslServer,
    UnsecuredJwsValidator,
)
from tierbroker.broker.security.sasl.plain import PlainSaslServer
from tierbroker.broker.security.sasl.scram import ScramCredential, ScramMechanism
from tierbroker.broker.security.sasl.scram_client import ScramSaslClient
from tierbroker.broker.security.sasl.scram_server import ScramSaslServer

PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" user_admin="admin-secret" '
    "user_alice='al\\'ice' /* a comment */ user_bob=bob-pw;"
)


# JAAS ---------------------------------------------------------------------------------


def test_jaas_parses_kafka_syntax() -> None:
    (entry,) = parse_jaas_config(PLAIN_JAAS)
    assert entry.login_module == "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert entry.control_flag == "required"
    assert plain_users(entry.options) == {
        "admin": "admin-secret",
        "alice": "al'ice",
        "bob": "bob-pw",
    }
    assert jaas_options(PLAIN_JAAS)["username"] == "admin"


def test_jaas_several_entries() -> None:
    text = 'a.B required x="1"; // first\n c.D optional y="2";'
    assert [e.options for e in parse_jaas_config(text)] == [{"x": "1"}, {"y": "2"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Login module not specified"),
        ("a.B", "control flag not specified"),
        ("a.B mandatory;", "Invalid login module control flag 'mandatory'"),
        ('a.B required x="1"', "not terminated by semi-colon"),
        ("a.B required x=;", "Value not specified for key 'x'"),
        ('a.B required x="unterminated;', "unexpected"),
    ],
)
def test_jaas_errors(text: str, message: str) -> None:
    with pytest.raises(JaasConfigError, match=message):
        parse_jaas_config(text)


# PLAIN --------------------------------------------------------------------------------


async def test_plain_accepts_a_user_and_refuses_the_rest() -> None:
    users = {"alice": "secret"}
    server = PlainSaslServer(users)
    assert await server.evaluate_response(b"\0alice\0secret") == b""
    assert server.complete and server.authorization_id == "alice"
    for token, message in [
        (b"\0alice\0wrong", "Invalid username or password"),
        (b"\0nobody\0secret", "Invalid username or password"),
        (b"\0\0secret", "username not specified"),
        (b"\0alice\0", "password not specified"),
        (b"bob\0alice\0secret", "authorization id that is different"),
        (b"alice\0secret", "expected 3 tokens, got 2"),
    ]:
        with pytest.raises(SaslAuthenticationError, match=message):
            await PlainSaslServer(users).evaluate_response(token)


# SCRAM --------------------------------------------------------------------------------

RFC7677_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")


def rfc7677_credential() -> ScramCredential:
    sha256 = ScramMechanism.SCRAM_SHA_256
    return sha256.credential(
        sha256.salted_password("pencil", RFC7677_SALT, 4096), RFC7677_SALT, 4096
    )


async def test_scram_sha256_rfc7677_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scram_server, "_server_nonce", lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    credential = rfc7677_credential()
    server = ScramSaslServer(
        ScramMechanism.SCRAM_SHA_256, lambda m, user: credential if user == "user" else None
    )
    first = await server.evaluate_response(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final = await server.evaluate_response(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.authorization_id == "user"


def test_scram_credential_text_round_trips() -> None:
    credential = rfc7677_credential()
    text = credential.encode()
    assert text.startswith("salt=W22ZaJ0SNY7soEsUEjb6gQ==,stored_key=")
    assert text.endswith(",iterations=4096")
    assert ScramCredential.decode(text) == credential
    with pytest.raises(ValueError, match="not a SCRAM credential"):
        ScramCredential.decode("salt=xx")


async def scram_exchange(
    mechanism: ScramMechanism, stored: dict[str, ScramCredential], user: str, password: str
) -> ScramSaslServer:
    server = ScramSaslServer(mechanism, lambda m, u: stored.get(u) if m is mechanism else None)
    client = ScramSaslClient(mechanism, user, password)
    server_first = await server.evaluate_response(client.first_message())
    server_final = await server.evaluate_response(client.final_message(server_first))
    client.verify(server_final)
    return server


@pytest.mark.parametrize("mechanism", list(ScramMechanism))
async def test_scram_round_trip_and_wrong_password(mechanism: ScramMechanism) -> None:
    stored = {"a,b=c": mechanism.new_credential("pw", 8192)}
    server = await scram_exchange(mechanism, stored, "a,b=c", "pw")
    assert server.authorization_id == "a,b=c"
    with pytest.raises(InvalidCredentialsError, match="Invalid client credentials"):
        await scram_exchange(mechanism, stored, "a,b=c", "not-pw")


async def test_scram_unknown_user_fails_only_at_the_proof() -> None:
    """The server-first of an unknown user looks like a real one (same salt each time)."""
    sha512 = ScramMechanism.SCRAM_SHA_512
    firsts = []
    for _ in range(2):
        server = ScramSaslServer(sha512, lambda m, u: None)
        client = ScramSaslClient(sha512, "ghost", "pw")
        first = await server.evaluate_response(client.first_message())
        firsts.append(first.split(b",", 1)[1])
        with pytest.raises(InvalidCredentialsError, match="Invalid user credentials"):
            await server.evaluate_response(client.final_message(first))
    assert firsts[0] == firsts[1] and firsts[0].endswith(b",i=4096")


async def test_scram_wrong_nonce_and_malformed_messages() -> None:
    sha256 = ScramMechanism.SCRAM_SHA_256
    stored = {"u": sha256.new_credential("pw")}
    server = ScramSaslServer(sha256, lambda m, u: stored.get(u))
    client = ScramSaslClient(sha256, "u", "pw")
    first = await server.evaluate_response(client.first_message())
    final = client.final_message(first).replace(b",p=", b"X,p=", 1)
    with pytest.raises(InvalidCredentialsError, match="nonce"):
        await server.evaluate_response(final)
    with pytest.raises(IllegalSaslStateError):  # a failed exchange takes no more tokens
        await server.evaluate_response(final)
    for garbage in [b"", b"\xff\xfe", b"y,,n=u,r=abc", b"n,,n=u", b"n,,n=a=b,r=x"]:
        with pytest.raises(InvalidCredentialsError):
            await ScramSaslServer(sha256, lambda m, u: None).evaluate_response(garbage)


async def test_scram_refuses_token_auth_and_low_iterations() -> None:
    sha256 = ScramMechanism.SCRAM_SHA_256
    with pytest.raises(InvalidCredentialsError, match="Token Authentication failed"):
        await ScramSaslServer(sha256, lambda m, u: None).evaluate_response(
            b"n,,n=u,r=abc,tokenauth=true"
        )
    weak = sha256.credential(sha256.salted_password("pw", b"salt", 1000), b"salt", 1000)
    with pytest.raises(InvalidCredentialsError, match="less than the minimum 4096"):
        await ScramSaslServer(sha256, lambda m, u: weak).evaluate_response(b"n,,n=u,r=abc")


# OAUTHBEARER --------------------------------------------------------------------------


def b64url(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def unsecured_jws(claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
    return f"{b64url(header or {'alg': 'none'})}.{b64url(claims)}."


def client_first(token: str, authzid: str = "") -> bytes:
    return f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01\x01".encode()


async def test_oauthbearer_unsecured_token_sets_principal_and_expiry() -> None:
    exp = int(time.time()) + 60
    server = OAuthBearerSaslServer(UnsecuredJwsValidator())
    token = unsecured_jws({"sub": "alice", "iat": int(time.time()), "exp": exp})
    assert await server.evaluate_response(client_first(token, "alice")) == b""
    assert server.complete and server.authorization_id == "alice"
    assert server.credential_expiry_ms == exp * 1000


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (unsecured_jws({"sub": "a", "exp": 1}), "expired"),
        (unsecured_jws({"sub": "a"}), "No expiration time"),
        (unsecured_jws({"exp": 2**40}), "No principal name in JWT claim: sub"),
        (unsecured_jws({"sub": "a", "exp": 2**40}, {"alg": "RS256"}), "'none'"),
        (unsecured_jws({"sub": "a", "exp": 2**40}) + "sig", "digital signature"),
        (unsecured_jws({"sub": "a", "exp": 2**40, "iat": 2**39}), "in the future"),
        ("a..b", "contains '..'"),
        ("abc", "3 dot-separated"),
    ],
)
async def test_oauthbearer_unsecured_rules(token: str, reason: str) -> None:
    with pytest.raises(InvalidTokenError, match=reason):
        await UnsecuredJwsValidator().validate(token)


async def test_oauthbearer_failure_answers_json_then_fails_on_control_a() -> None:
    server = OAuthBearerSaslServer(UnsecuredJwsValidator(required_scope=("kafka",)))
    token = unsecured_jws({"sub": "a", "exp": 2**40, "scope": "other"})
    assert json.loads(await server.evaluate_response(client_first(token))) == {
        "status": "invalid_token"
    }
    with pytest.raises(SaslAuthenticationError) as failed:
        await server.evaluate_response(b"\x01")
    assert "scope" in failed.value.reason
    with pytest.raises(InvalidCredentialsError):
        await OAuthBearerSaslServer(UnsecuredJwsValidator()).evaluate_response(b"n,,junk")


class FixedJwks(JwksValidator):
    """A JWKS served from memory: the fetch itself is tested with a real HTTP server."""

    def __init__(self, settings: JwksSettings, jwks: dict[str, Any]) -> None:
        super().__init__(settings)
        self.fetches = 0
        self._jwks = jwks

    async def _refresh(self, asked_s: float) -> None:
        self.fetches += 1
        self._keys = {k.key_id: k for k in jwt.PyJWKSet.from_dict(self._jwks).keys}
        self._fetched_s = time.monotonic()


async def test_jwks_validation_checks_signature_audience_and_issuer() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = {"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}
    settings = JwksSettings(
        url="http://idp/jwks", expected_audience=("kafka",), expected_issuer="idp"
    )
    validator = FixedJwks(settings, jwks)
    claims = {"sub": "svc", "aud": "kafka", "iss": "idp", "exp": int(time.time()) + 60}
    good = jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})
    token = await validator.validate(good)
    assert token.principal_name == "svc"
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for bad, reason in [
        (jwt.encode(claims, other, algorithm="RS256", headers={"kid": "k1"}), "Signature"),
        (
            jwt.encode({**claims, "aud": "x"}, key, algorithm="RS256", headers={"kid": "k1"}),
            "(?i)audience",
        ),
        (
            jwt.encode({**claims, "iss": "x"}, key, algorithm="RS256", headers={"kid": "k1"}),
            "(?i)issuer",
        ),
        (
            jwt.encode({**claims, "exp": 1}, key, algorithm="RS256", headers={"kid": "k1"}),
            "(?i)expired",
        ),
        (jwt.encode(claims, "secret-key-of-32-bytes-or-more!!", algorithm="HS256"), "HS256"),
        (unsecured_jws(claims), "'none'"),
    ]:
        with pytest.raises(InvalidTokenError, match=reason):
            await validator.validate(bad)
    assert validator.fetches == 1  # one fetch served every known key
