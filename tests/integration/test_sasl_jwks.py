"""OAUTHBEARER with tokens signed by an identity provider: the broker fetches the keys
from the JWKS endpoint (`sasl.oauthbearer.jwks.endpoint.url`, here a small HTTP server in
the test) and admits aiokafka with a token for the expected audience and issuer, and
refuses one for another audience or signed by another key."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.abc import AbstractTokenProvider
from aiokafka.errors import KafkaError
from cryptography.hazmat.primitives.asymmetric import rsa

from tierbroker.broker.server.embedded import EmbeddedCluster

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


class JwksServer:
    """Serves one key set at /jwks and counts the fetches."""

    def __init__(self) -> None:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key()))
        body = json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]})
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.fetches += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *_args: Any) -> None:
                pass

        self.fetches = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/jwks"


@pytest.fixture(scope="module")
def jwks() -> Iterator[JwksServer]:
    server = JwksServer()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, jwks: JwksServer
) -> Iterator[EmbeddedCluster]:
    directory: Path = tmp_path_factory.mktemp("jwks")
    properties = {
        "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "listener.name.client.sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.client.oauthbearer.sasl.oauthbearer.jwks.endpoint.url": jwks.url,
        "sasl.oauthbearer.expected.audience": "kafka",
        "sasl.oauthbearer.expected.issuer": "https://idp.example",
        "log.dir.min.free.bytes": "0",
    }
    with EmbeddedCluster(directory, properties=properties) as cluster:
        yield cluster


class Tokens(AbstractTokenProvider):
    def __init__(self, key: rsa.RSAPrivateKey, audience: str) -> None:
        self.key = key
        self.audience = audience

    async def token(self) -> str:
        claims = {
            "sub": "svc-orders",
            "aud": self.audience,
            "iss": "https://idp.example",
            "iat": int(time.time()),
            "exp": int(time.time()) + 300,
        }
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "k1"})


def send(cluster: EmbeddedCluster, tokens: Tokens) -> None:
    endpoint = cluster.brokers[0].endpoints.listener("CLIENT")

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=f"{endpoint.host}:{endpoint.port}",
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="OAUTHBEARER",
            sasl_oauth_token_provider=tokens,
            request_timeout_ms=10_000,
        )
        try:
            await producer.start()
            await producer.send_and_wait("jwks", b"signed")
        finally:
            await producer.stop()

    asyncio.run(run())


def authentications(cluster: EmbeddedCluster, outcome: str) -> float:
    registry = cluster.brokers[0].registry
    return cluster.read(
        lambda: (
            registry.get_sample_value(f"{outcome}_authentication_total", {"listener": "CLIENT"})
            or 0.0
        )
    )


def test_a_token_signed_by_the_provider_is_admitted(
    cluster: EmbeddedCluster, jwks: JwksServer
) -> None:
    before = authentications(cluster, "successful")
    send(cluster, Tokens(KEY, "kafka"))
    assert authentications(cluster, "successful") > before
    assert jwks.fetches >= 1


@pytest.mark.parametrize(
    "tokens", [Tokens(KEY, "another-service"), Tokens(OTHER_KEY, "kafka")], ids=["aud", "key"]
)
def test_a_token_for_another_audience_or_key_is_refused(
    cluster: EmbeddedCluster, tokens: Tokens
) -> None:
    before = authentications(cluster, "failed")
    with pytest.raises(KafkaError):
        send(cluster, tokens)
    assert authentications(cluster, "failed") > before
