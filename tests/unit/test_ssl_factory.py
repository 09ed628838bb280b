"""SSL contexts from Kafka's `ssl.*` properties: each store format, the checks of bad
settings, and real handshakes (in memory) for client authentication, host name checks,
protocol versions and cipher suites, on certificates made by openssl."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from tests.certs import KEY_PASSWORD, STORE_PASSWORD, Certificates, session_certs
from tierbroker.broker.config.broker_config import ConfigError
from tierbroker.broker.config.security_settings import SecuritySettings
from tierbroker.broker.security.principal import ANONYMOUS
from tierbroker.broker.security.ssl_factory import client_context, server_context
from tierbroker.broker.security.ssl_principal import SslPrincipalBuilder, SslPrincipalMapper
from tierbroker.broker.security.ssl_stores import StoreSettings

LISTENER = "SSL"


def settings(**values: str) -> StoreSettings:
    return StoreSettings(
        SecuritySettings({k.replace("_", "."): v for k, v in values.items()}), LISTENER
    )


def p12_server(certs: Certificates, **more: str) -> StoreSettings:
    return settings(
        ssl_keystore_type="PKCS12",
        ssl_keystore_location=str(certs.broker.p12),
        ssl_keystore_password=STORE_PASSWORD,
        ssl_truststore_type="PEM",
        ssl_truststore_location=str(certs.ca.cert),
        **more,
    )


def trusting_client(certs: Certificates, cert: bool = False, **more: str) -> StoreSettings:
    values = {"ssl_truststore_type": "PEM", "ssl_truststore_location": str(certs.ca.cert), **more}
    if cert:
        values |= {"ssl_keystore_type": "PKCS12", "ssl_keystore_location": str(certs.client.p12)}
        values |= {"ssl_keystore_password": STORE_PASSWORD}
    return settings(**values)


def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, host: str = "localhost"
) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """Both ends' SSL objects after a handshake through memory; the error of either end."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c = client.wrap_bio(c_in, c_out, server_hostname=host)
    done = {s: False, c: False}
    for _ in range(20):
        for end in (c, s):
            if not done[end]:
                try:
                    end.do_handshake()
                    done[end] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server sees a client certificate only once it reads on.
            for end in (s, c):
                try:
                    end.read(1)
                except ssl.SSLWantReadError:
                    pass
                s_in.write(c_out.read())
                c_in.write(s_out.read())
            return s, c
    raise AssertionError("handshake did not finish")


def principal(server: ssl.SSLObject) -> str:
    return str(SslPrincipalBuilder(SslPrincipalMapper()).principal(server))


def test_pkcs12_stores_one_way_tls() -> None:
    certs = session_certs()
    server = server_context(p12_server(certs)).context
    s, c = handshake(server, client_context(trusting_client(certs)))
    assert c.version() == "TLSv1.3"
    assert principal(s) == str(ANONYMOUS)


def test_pem_file_and_inline_pem_stores() -> None:
    certs = session_certs()
    combined = certs.broker.encrypted_key.parent / "broker-combined.pem"
    combined.write_bytes(certs.broker.encrypted_key.read_bytes() + certs.broker.chain.read_bytes())
    from_file = settings(
        ssl_keystore_type="PEM", ssl_keystore_location=str(combined), ssl_key_password=KEY_PASSWORD
    )
    inline = settings(
        ssl_keystore_type="PEM",
        ssl_keystore_certificate_chain=certs.broker.chain.read_text(),
        ssl_keystore_key=certs.broker.key.read_text(),
    )
    client = settings(
        ssl_truststore_type="PEM", ssl_truststore_certificates=certs.ca.cert.read_text()
    )
    for server in (from_file, inline):
        built = server_context(server)
        assert len(built.keystore.chain) == 2
        handshake(built.context, client_context(client))


def test_jks_type_reads_a_pkcs12_file_and_refuses_a_java_store(tmp_path: Path) -> None:
    certs = session_certs()
    compat = settings(
        ssl_keystore_location=str(certs.broker.p12), ssl_keystore_password=STORE_PASSWORD
    )  # ssl.keystore.type defaults to JKS, as Kafka's
    server_context(compat)
    jks = tmp_path / "broker.jks"
    subprocess.run(
        ["keytool", "-importkeystore", "-srckeystore", certs.broker.p12, "-srcstoretype",
         "PKCS12", "-srcstorepass", STORE_PASSWORD, "-destkeystore", jks, "-deststoretype",
         "JKS", "-deststorepass", STORE_PASSWORD, "-noprompt"],
        check=True, capture_output=True,
    )  # fmt: skip
    refused = settings(ssl_keystore_location=str(jks), ssl_keystore_password=STORE_PASSWORD)
    with pytest.raises(ConfigError, match=r"keytool -importkeystore .* PKCS12"):
        server_context(refused)


def test_client_auth_required_refuses_a_client_without_a_certificate() -> None:
    certs = session_certs()
    server = server_context(p12_server(certs, ssl_client_auth="required")).context
    with pytest.raises(ssl.SSLError):
        handshake(server, client_context(trusting_client(certs)))
    s, _ = handshake(server, client_context(trusting_client(certs, cert=True)))
    assert principal(s) == "User:CN=client,O=tierbroker-tests"


def test_client_auth_requested_takes_both() -> None:
    certs = session_certs()
    server = server_context(p12_server(certs, ssl_client_auth="requested")).context
    s, _ = handshake(server, client_context(trusting_client(certs)))
    assert principal(s) == "User:ANONYMOUS"
    s, _ = handshake(server, client_context(trusting_client(certs, cert=True)))
    assert principal(s) == "User:CN=client,O=tierbroker-tests"


def test_client_certificate_of_another_ca_is_refused() -> None:
    certs = session_certs()
    server = server_context(p12_server(certs, ssl_client_auth="required")).context
    intruder = settings(
        ssl_truststore_type="PEM",
        ssl_truststore_location=str(certs.ca.cert),
        ssl_keystore_type="PKCS12",
        ssl_keystore_location=str(certs.other_client.p12),
        ssl_keystore_password=STORE_PASSWORD,
    )
    with pytest.raises(ssl.SSLError):
        handshake(server, client_context(intruder))


def test_client_that_does_not_trust_the_ca_refuses_the_broker() -> None:
    certs = session_certs()
    server = server_context(p12_server(certs)).context
    other = settings(ssl_truststore_type="PEM", ssl_truststore_location=str(certs.other_ca.cert))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client_context(other))


def test_endpoint_identification() -> None:
    certs = session_certs()
    server = server_context(p12_server(certs)).context
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(server, client_context(trusting_client(certs)), host="broker.example")
    handshake(server, client_context(trusting_client(certs)), host="127.0.0.1")
    unchecked = trusting_client(certs, ssl_endpoint_identification_algorithm="")
    handshake(server, client_context(unchecked), host="broker.example")


def test_protocols_and_kafka_cipher_suite_names() -> None:
    certs = session_certs()
    suite = "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
    server = server_context(p12_server(certs, ssl_cipher_suites=suite)).context
    _, c = handshake(server, client_context(trusting_client(certs)))
    assert (c.version(), c.cipher()[0]) == ("TLSv1.2", "ECDHE-RSA-AES128-GCM-SHA256")
    only13 = server_context(p12_server(certs, ssl_enabled_protocols="TLSv1.3")).context
    with pytest.raises(ssl.SSLError):
        handshake(only13, client_context(trusting_client(certs, ssl_protocol="TLSv1.2")))


P12 = {"ssl.keystore.location": "BROKER_P12", "ssl.keystore.password": STORE_PASSWORD}
INLINE = {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "BROKER_CHAIN_TEXT"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "listener SSL uses TLS and has no key store: set ssl.keystore.location"),
        (
            {"listener.name.ssl.ssl.keystore.location": "/nonexistent/ks.p12", **P12},
            "listener.name.ssl.ssl.keystore.location=/nonexistent/ks.p12: cannot be read",
        ),
        ({**P12, "ssl.keystore.password": "wrong"}, "or the password is wrong"),
        ({"ssl.keystore.location": "BROKER_P12"}, "set ssl.keystore.password"),
        (
            {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": "BROKER_CHAIN",
                "ssl.keystore.password": "x",
            },
            "ssl.keystore.password cannot be used with PEM",
        ),
        ({**P12, "ssl.keystore.type": "JCEKS"}, "ssl.keystore.type=JCEKS: use PKCS12, PEM or JKS"),
        (
            {**INLINE, "ssl.keystore.key": "ENCRYPTED_KEY_TEXT", "ssl.key.password": "wrong"},
            "ssl.keystore.key: ssl.key.password is wrong",
        ),
        ({**INLINE, "ssl.keystore.key": "OTHER_KEY_TEXT"}, "the private key is not the first"),
        ({**P12, "ssl.client.auth": "always"}, "ssl.client.auth=always: use none, requested or"),
        ({**P12, "ssl.enabled.protocols": "TLSv1.4"}, "ssl.enabled.protocols=TLSv1.4: use some"),
        ({**P12, "ssl.protocol": "DTLS"}, "ssl.protocol=DTLS: use"),
        ({**P12, "ssl.cipher.suites": "NO_SUCH_SUITE"}, "OpenSSL knows none of these cipher"),
    ],
)
def test_bad_settings_name_the_property(values: dict[str, str], message: str) -> None:
    certs = session_certs()
    stand_ins = {
        "BROKER_P12": str(certs.broker.p12),
        "BROKER_CHAIN": str(certs.broker.chain),
        "BROKER_CHAIN_TEXT": certs.broker.chain.read_text(),
        "ENCRYPTED_KEY_TEXT": certs.broker.encrypted_key.read_text(),
        "OTHER_KEY_TEXT": certs.client.key.read_text(),
    }
    given = {k: stand_ins.get(v, v) for k, v in values.items()}
    with pytest.raises(ConfigError) as raised:
        server_context(StoreSettings(SecuritySettings(given), LISTENER))
    assert message in str(raised.value)
    assert "BEGIN" not in str(raised.value)  # inline keys are never shown
