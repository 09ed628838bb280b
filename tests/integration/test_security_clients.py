"""Every stock client over SASL_SSL with each mechanism: kafka-python, aiokafka, kafkajs,
kcat (librdkafka 2.0) and the Java client log in with PLAIN, SCRAM-SHA-512 and OAUTHBEARER
(Kafka's unsecured JWS), each configured its own way, on one broker's SASL_SSL listener
(certificates made with openssl by tests/certs.py), and produce and consume. A wrong
password is refused with the client's name for SASL_AUTHENTICATION_FAILED (58), a client
that does not trust the broker's CA with its TLS error, each well within the client's own
timeouts. confluent-kafka's matrix is test_sasl_ssl's; TLS alone, test_tls's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import logging
import shutil
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import AbstractTokenProvider as AioTokenProvider
from aiokafka.errors import KafkaConnectionError
from aiokafka.helpers import create_ssl_context
from confluent_kafka.admin import AdminClient, NewTopic

from tests.apache_kafka import run_java
from tests.certs import STORE_PASSWORD, Certificates
from tests.integration.test_kafkajs import node
from tierbroker.broker.security.sasl.scram import ScramMechanism
from tierbroker.broker.server.embedded import EmbeddedCluster

# kafka-python loads its schemas with importlib.resources' deprecated calls (its warning).
LEGACY_RESOURCES = "read_text is deprecated|open_text is deprecated"
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", LEGACY_RESOURCES, DeprecationWarning)
    import kafka
    from kafka.net.sasl.oauth import AbstractTokenProvider as KafkaPythonTokenProvider

# A kafka-python producer that failed to bootstrap leaves what it opened to the garbage
# collector, in its own network thread's time: the failed handshake's blocking TLS socket
# and its event loop's socket pair (AF_UNIX). The broker has neither kind.
UNRAISABLE = "ignore:Exception ignored in. {}:pytest.PytestUnraisableExceptionWarning"
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:{LEGACY_RESOURCES}:DeprecationWarning"),
    pytest.mark.filterwarnings(UNRAISABLE.format("<ssl.SSLSocket ")),
    pytest.mark.filterwarnings(UNRAISABLE.format(r"<socket.socket fd=\d+, family=1,")),
]

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "alice", "alice-pw"
MECHANISMS = ("PLAIN", "SCRAM-SHA-512", "OAUTHBEARER")
COUNT = 10
VALUES = [f"v{i}" for i in range(COUNT)]
CLIENT_TIMEOUT_S = 60.0  # each client's own request and metadata timeouts, set so
REFUSED_WITHIN_S = 15.0  # a refusal comes well before them, on a loaded machine
REFUSAL_BOOTSTRAP_MS = 3000  # kafka-python's bootstrap timeout when it is to be refused
PROCESS_TIMEOUT_S = 120.0
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
INVALID_CREDENTIALS = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism SCRAM-SHA-512"
)
UNSECURED_LOGIN = (
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured."
    "OAuthBearerUnsecuredLoginCallbackHandler"
)


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[EmbeddedCluster]:
    """One broker: CLIENT is SASL_SSL with the three mechanisms, INTERNAL in the clear (the
    inter-broker listener, where the tests create their topics)."""
    properties = {
        "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(certs.broker.p12),
        "ssl.keystore.password": STORE_PASSWORD,
        "listener.name.client.sasl.enabled.mechanisms": ",".join(MECHANISMS),
        "listener.name.client.plain.sasl.jaas.config": (
            f'{PLAIN_MODULE} required user_{USER}="{PASSWORD}";'
        ),
        "log.dir.min.free.bytes": "0",
        "offsets.topic.num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    with EmbeddedCluster(tmp_path_factory.mktemp("secured-clients"), properties=properties) as c:
        sha512 = ScramMechanism.SCRAM_SHA_512
        credential = sha512.new_credential(PASSWORD)
        c.call(c.brokers[0].scram_credentials.alter(USER, {sha512: credential}))
        yield c


def address(broker: EmbeddedCluster, listener: str) -> str:
    endpoint = broker.brokers[0].endpoints.listener(listener)
    return f"{endpoint.host}:{endpoint.port}"


def create_topic(broker: EmbeddedCluster, prefix: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": address(broker, "INTERNAL")})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(CLIENT_TIMEOUT_S)
    return topic


@dataclass(frozen=True, slots=True, kw_only=True)
class Login:
    """How a client connects: SASL_SSL to `bootstrap`, trusting the CA in `ca` (PEM),
    logging in with `mechanism` as USER with `password` (OAUTHBEARER: an unsecured JWS
    whose subject is USER)."""

    bootstrap: str
    ca: Path
    mechanism: str
    password: str = PASSWORD


def unsecured_jws(subject: str) -> str:
    """Kafka's unsecured JWS: alg "none", no signature, as its unsecured login module makes."""

    def encode(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = int(time.time())
    return f"{encode({'alg': 'none'})}.{encode({'sub': subject, 'iat': now, 'exp': now + 3600})}."


class KafkaPythonToken(KafkaPythonTokenProvider):
    def token(self) -> str:
        return unsecured_jws(USER)


class AioToken(AioTokenProvider):
    async def token(self) -> str:
        return unsecured_jws(USER)


def python_sasl(login: Login, token_provider: object) -> dict[str, Any]:
    """kafka-python's and aiokafka's SASL settings (they share their names)."""
    if login.mechanism == "OAUTHBEARER":
        return {"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": token_provider}
    return {
        "sasl_mechanism": login.mechanism,
        "sasl_plain_username": USER,
        "sasl_plain_password": login.password,
    }


def kafka_python_settings(login: Login) -> dict[str, Any]:
    return {
        "bootstrap_servers": login.bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(login.ca),
        "request_timeout_ms": int(CLIENT_TIMEOUT_S * 1000),
        **python_sasl(login, KafkaPythonToken()),
    }


def kafka_python_round_trip(login: Login, topic: str) -> list[str]:
    settings = kafka_python_settings(login)
    producer = kafka.KafkaProducer(
        acks="all", max_block_ms=int(CLIENT_TIMEOUT_S * 1000), **settings
    )
    try:
        for value in VALUES:
            producer.send(topic, value.encode(), partition=0)
        producer.flush(CLIENT_TIMEOUT_S)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(
        auto_offset_reset="earliest", consumer_timeout_ms=int(CLIENT_TIMEOUT_S * 1000), **settings
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        return [m.value.decode() for _, m in zip(range(COUNT), consumer, strict=False)]
    finally:
        consumer.close()


@contextlib.contextmanager
def client_log(name: str) -> Iterator[list[str]]:
    """The warnings and errors logger `name` (a client's) logs meanwhile."""
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def kafka_python_refusal(login: Login) -> str:
    """kafka-python 3.0 retries a failed login or handshake until its bootstrap timeout,
    then raises KafkaTimeoutError: what refused it is in its log, each attempt's."""
    settings = kafka_python_settings(login)
    with client_log("kafka") as lines, pytest.raises(kafka.errors.KafkaTimeoutError):
        kafka.KafkaProducer(bootstrap_timeout_ms=REFUSAL_BOOTSTRAP_MS, **settings)
    return "\n".join(lines)


def aiokafka_settings(login: Login) -> dict[str, Any]:
    return {
        "bootstrap_servers": login.bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=str(login.ca)),
        "request_timeout_ms": int(CLIENT_TIMEOUT_S * 1000),
        **python_sasl(login, AioToken()),
    }


def aiokafka_round_trip(login: Login, topic: str) -> list[str]:
    async def run() -> list[str]:
        settings = aiokafka_settings(login)
        producer = AIOKafkaProducer(acks="all", **settings)
        await producer.start()
        try:
            for value in VALUES:
                await producer.send_and_wait(topic, value.encode(), partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(auto_offset_reset="earliest", **settings)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            values: list[str] = []
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                async for message in consumer:
                    values.append(message.value.decode())
                    if len(values) == COUNT:
                        break
            return values
        finally:
            await consumer.stop()

    return asyncio.run(run())


def aiokafka_refusal(login: Login) -> str:
    """aiokafka tries each bootstrap server once and raises KafkaConnectionError("Unable to
    bootstrap"); what refused it is in its log."""

    async def start() -> None:
        producer = AIOKafkaProducer(**aiokafka_settings(login))
        try:
            await producer.start()
        finally:
            await producer.stop()

    with client_log("aiokafka") as lines, pytest.raises(KafkaConnectionError):
        asyncio.run(start())
    # It leaves the transport of a failed TLS handshake unclosed: collected here, quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    return "\n".join(lines)


class ClientFailed(Exception):
    """A client program reported a failure: `name` its error's name, args[0] its message."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def kafkajs_round_trip(login: Login, topic: str) -> list[str]:
    command = [
        node(), str(ROOT / "tests" / "js" / "sasl_ssl.js"), login.bootstrap, str(login.ca),
        login.mechanism.lower(), USER, login.password, topic, str(COUNT),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    result = json.loads(done.stdout.splitlines()[-1])
    if "error" in result:
        raise ClientFailed(result["error"]["name"], result["error"]["message"])
    return list(result["values"])


def librdkafka_sasl(login: Login) -> dict[str, str]:
    """librdkafka's settings (kcat's `-X`)."""
    settings = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(login.ca),
        "sasl.mechanisms": login.mechanism,
        "socket.timeout.ms": str(int(CLIENT_TIMEOUT_S * 1000)),
    }
    if login.mechanism == "OAUTHBEARER":
        # librdkafka's own unsecured JWS, its subject from sasl.oauthbearer.config.
        return settings | {
            "enable.sasl.oauthbearer.unsecure.jwt": "true",
            "sasl.oauthbearer.config": f"principal={USER}",
        }
    return settings | {"sasl.username": USER, "sasl.password": login.password}


def kcat_round_trip(login: Login, topic: str) -> list[str]:
    exe = shutil.which("kcat")
    assert exe is not None, "kcat is not installed: apt-get install -y kcat"
    options = [arg for k, v in librdkafka_sasl(login).items() for arg in ("-X", f"{k}={v}")]

    def run(*args: str, stdin: str | None = None) -> str:
        command = [exe, "-b", login.bootstrap, *options, *args]
        done = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S
        )
        if done.returncode != 0 or "ERROR" in done.stderr:
            raise ClientFailed("kcat", done.stderr)
        return done.stdout

    run("-P", "-t", topic, "-p", "0", stdin="\n".join(VALUES) + "\n")
    return run("-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q").splitlines()


def program_refusal(round_trip: Callable[[Login, str], list[str]]) -> Callable[[Login], str]:
    """A client program's refusal: the error it reports, by name and message."""

    def refusal(login: Login) -> str:
        with pytest.raises(ClientFailed) as failed:
            round_trip(login, "never-written")
        return f"{failed.value.name}: {failed.value}"

    return refusal


@dataclass(frozen=True, slots=True)
class Client:
    round_trip: Callable[[Login, str], list[str]]  # the values read back
    refusal: Callable[[Login], str]  # the error the client reports, as it names it


CLIENTS = {
    "kafka-python": Client(kafka_python_round_trip, kafka_python_refusal),
    "aiokafka": Client(aiokafka_round_trip, aiokafka_refusal),
    "kafkajs": Client(kafkajs_round_trip, program_refusal(kafkajs_round_trip)),
    "kcat": Client(kcat_round_trip, program_refusal(kcat_round_trip)),
}


def login(broker: EmbeddedCluster, certs: Certificates, mechanism: str) -> Login:
    return Login(bootstrap=address(broker, "CLIENT"), ca=certs.ca.cert, mechanism=mechanism)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_produce_and_consume(
    broker: EmbeddedCluster, certs: Certificates, client: str, mechanism: str
) -> None:
    topic = create_topic(broker, f"{client}-{mechanism.lower()}")
    assert CLIENTS[client].round_trip(login(broker, certs, mechanism), topic) == VALUES


# The Java client: every case in one JVM (tests/java/SecuredClients.java). ---------------


def java_settings(login: Login) -> dict[str, str]:
    """The Java client's settings: the CA as a PEM trust store, and a JAAS login module per
    mechanism; OAUTHBEARER's is Kafka's unsecured one (the default login callback handler
    without a token endpoint, named here all the same), which makes a JWS of its subject."""
    jaas = {
        "PLAIN": f'{PLAIN_MODULE} required username="{USER}" password="{login.password}";',
        "SCRAM-SHA-512": f'{SCRAM_MODULE} required username="{USER}" password="{login.password}";',
        "OAUTHBEARER": f'{OAUTHBEARER_MODULE} required unsecuredLoginStringClaim_sub="{USER}";',
    }
    settings = {
        "security.protocol": "SASL_SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(login.ca),
        "sasl.mechanism": login.mechanism,
        "sasl.jaas.config": jaas[login.mechanism],
        "request.timeout.ms": str(int(CLIENT_TIMEOUT_S * 1000)),
        "default.api.timeout.ms": str(int(CLIENT_TIMEOUT_S * 1000)),
        "reconnect.backoff.ms": "100",
    }
    if login.mechanism == "OAUTHBEARER":
        settings["sasl.login.callback.handler.class"] = UNSECURED_LOGIN
    return settings


@pytest.fixture(scope="module")
def java_results(
    broker: EmbeddedCluster, certs: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Each case's line of SecuredClients' output, by case name: a round trip per
    mechanism, then the two refusals."""
    directory = tmp_path_factory.mktemp("java-clients")
    good = {m: login(broker, certs, m) for m in MECHANISMS}
    cases: list[tuple[str, str, Login]] = [
        (m, create_topic(broker, f"java-{m.lower()}"), good[m]) for m in MECHANISMS
    ]
    scram = good["SCRAM-SHA-512"]
    cases += [
        ("wrong-password", "-", replace(scram, password="wrong")),
        ("untrusted-ca", "-", replace(scram, ca=certs.other_ca.cert)),
    ]
    arguments = []
    for name, topic, case in cases:
        properties = directory / f"{name}.properties"
        properties.write_text("".join(f"{k}={v}\n" for k, v in java_settings(case).items()))
        arguments.append(f"{name}:{topic}:{properties}")
    output = run_java(
        "SecuredClients.java", scram.bootstrap, str(COUNT), *arguments, timeout_s=PROCESS_TIMEOUT_S
    )
    return dict(line.split(" ", 1) for line in output.splitlines() if " " in line)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_java_client_produces_and_consumes(java_results: dict[str, str], mechanism: str) -> None:
    assert java_results[mechanism] == "received " + ",".join(VALUES)


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("wrong-password", f"SaslAuthenticationException {INVALID_CREDENTIALS}"),
        ("untrusted-ca", "SslAuthenticationException SSL handshake failed"),
    ],
)
def test_java_client_is_refused_quickly(
    java_results: dict[str, str], case: str, error: str
) -> None:
    outcome, millis, reported = java_results[case].split(" ", 2)
    assert outcome == "refused", java_results[case]
    assert reported.startswith(error), reported
    assert int(millis) < REFUSED_WITHIN_S * 1000, f"refused after {millis} ms"


# What each client reports when refused: SASL_AUTHENTICATION_FAILED (58) with Kafka's
# message, or its TLS library's verification failure.
WRONG_PASSWORD = {
    "kafka-python": "[Error 58] SaslAuthenticationFailedError",
    "aiokafka": "[Error 58] SaslAuthenticationFailed",
    "kafkajs": "KafkaJSSASLAuthenticationError",
    "kcat": "SASL authentication error",
}
UNTRUSTED_CA = {
    "kafka-python": "CERTIFICATE_VERIFY_FAILED",
    "aiokafka": "CERTIFICATE_VERIFY_FAILED",
    "kafkajs": "Connection error: self-signed certificate in certificate chain",
    # librdkafka names it "Local: SSL error" or, when the close wins the race, "Local:
    # Broker transport failure"; its reason is OpenSSL's either way.
    "kcat": "SSL routines::certificate verify failed",
}


@pytest.mark.parametrize("client", CLIENTS)
def test_wrong_password_is_refused_quickly(
    broker: EmbeddedCluster, certs: Certificates, client: str
) -> None:
    bad = replace(login(broker, certs, "SCRAM-SHA-512"), password="wrong")
    started = time.monotonic()
    reported = CLIENTS[client].refusal(bad)
    elapsed_s = time.monotonic() - started
    assert WRONG_PASSWORD[client] in reported, reported
    assert INVALID_CREDENTIALS in reported, reported
    assert elapsed_s < REFUSED_WITHIN_S, f"refused after {elapsed_s:.1f} s"


@pytest.mark.parametrize("client", CLIENTS)
def test_untrusted_ca_is_refused_quickly(
    broker: EmbeddedCluster, certs: Certificates, client: str
) -> None:
    bad = replace(login(broker, certs, "SCRAM-SHA-512"), ca=certs.other_ca.cert)
    started = time.monotonic()
    reported = CLIENTS[client].refusal(bad)
    elapsed_s = time.monotonic() - started
    assert UNTRUSTED_CA[client] in reported, reported
    assert elapsed_s < REFUSED_WITHIN_S, f"refused after {elapsed_s:.1f} s"
