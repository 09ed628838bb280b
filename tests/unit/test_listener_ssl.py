"""`ListenerSsl`: contexts per TLS listener, principals by each listener's rules, and
reloads checked as Kafka checks a dynamic key store update."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.certs import STORE_PASSWORD, session_certs
from tierbroker.broker.config.broker_config import ConfigError
from tierbroker.broker.config.listeners import Listener, SecurityProtocol
from tierbroker.broker.config.security_settings import SecuritySettings
from tierbroker.broker.security.listener_ssl import ListenerSsl, is_reconfigurable

PLAIN = Listener("PLAINTEXT", SecurityProtocol.PLAINTEXT, "127.0.0.1", 0)
EXTERNAL = Listener("EXTERNAL", SecurityProtocol.SSL, "127.0.0.1", 0)
INTERNAL = Listener("INTERNAL", SecurityProtocol.SSL, "127.0.0.1", 0)
KEYSTORE = "listener.name.external.ssl.keystore.location"


def listener_ssl(keystore: Path, **more: str) -> ListenerSsl:
    certs = session_certs()
    values = {
        "ssl.keystore.type": "PKCS12",
        KEYSTORE: str(keystore),
        "listener.name.internal.ssl.keystore.location": str(certs.broker.p12),
        "ssl.keystore.password": STORE_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca.cert),
        "listener.name.external.ssl.principal.mapping.rules": "RULE:^CN=([^,]*),.*$/$1/L",
        **more,
    }
    return ListenerSsl(SecuritySettings(values), [PLAIN, EXTERNAL, INTERNAL], "INTERNAL")


def test_contexts_for_tls_listeners_only() -> None:
    certs = session_certs()
    listeners = listener_ssl(certs.broker.p12)
    assert listeners.context_for(PLAIN) is None
    assert listeners.context_for(EXTERNAL) is not listeners.context_for(INTERNAL)
    assert str(listeners.principal(EXTERNAL, None)) == "User:ANONYMOUS"


def test_bad_mapping_rules_name_the_property() -> None:
    certs = session_certs()
    rules = {"listener.name.external.ssl.principal.mapping.rules": "RULE:bad"}
    prop = r"listener\.name\.external\.ssl\.principal\.mapping\.rules"
    with pytest.raises(ConfigError, match=prop):
        listener_ssl(certs.broker.p12, **rules)


def test_reload_with_the_same_subject_serves_a_new_context() -> None:
    certs = session_certs()
    renewed = certs.ca.issue("renewed", certs.broker.subject, "DNS:localhost,IP:127.0.0.1")
    listeners = listener_ssl(certs.broker.p12)
    before = listeners.context_for(EXTERNAL)
    internal = listeners.context_for(INTERNAL)
    listeners.reconfigure({KEYSTORE: str(renewed.p12)})
    assert listeners.context_for(EXTERNAL) is not before
    assert listeners.context_for(INTERNAL) is internal
    now = listeners.context_for(EXTERNAL)
    listeners.reconfigure({KEYSTORE: str(renewed.p12)})  # nothing changed: nothing rebuilt
    assert listeners.context_for(EXTERNAL) is now


def test_key_store_file_changed_in_place_reloads(tmp_path: Path) -> None:
    certs = session_certs()
    renewed = certs.ca.issue("in-place", certs.broker.subject, "DNS:localhost,IP:127.0.0.1")
    keystore = tmp_path / "broker.p12"
    shutil.copy(certs.broker.p12, keystore)
    listeners = listener_ssl(keystore)
    before = listeners.context_for(EXTERNAL)
    shutil.copy(renewed.p12, keystore)
    stat = keystore.stat()
    os.utime(keystore, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    listeners.reconfigure({})
    assert listeners.context_for(EXTERNAL) is not before


def test_reload_refuses_another_subject_or_other_names_unless_allowed() -> None:
    certs = session_certs()
    other_subject = certs.ca.issue(
        "other-subject", "/O=elsewhere/CN=localhost", "DNS:localhost,IP:127.0.0.1"
    )
    other_names = certs.ca.issue("other-names", certs.broker.subject, "DNS:broker.example")
    listeners = listener_ssl(certs.broker.p12)
    before = listeners.context_for(EXTERNAL)
    with pytest.raises(ConfigError, match=r"CN=localhost,O=elsewhere.*ssl\.allow\.dn\.changes"):
        listeners.check({KEYSTORE: str(other_subject.p12)})
    with pytest.raises(ConfigError, match=r"ssl\.allow\.san\.changes"):
        listeners.reconfigure({KEYSTORE: str(other_names.p12)})
    assert listeners.context_for(EXTERNAL) is before
    allowing = listener_ssl(certs.broker.p12, **{"ssl.allow.dn.changes": "true"})
    allowing.reconfigure({KEYSTORE: str(other_subject.p12)})


def test_inter_broker_listener_refuses_stores_that_do_not_verify_each_other() -> None:
    certs = session_certs()
    other_ca_cert = certs.other_ca.issue(
        "other-ca-broker", certs.broker.subject, "DNS:localhost,IP:127.0.0.1"
    )
    listeners = listener_ssl(certs.broker.p12)
    change = {"listener.name.internal.ssl.keystore.location": str(other_ca_cert.p12)}
    with pytest.raises(ConfigError, match="inter-broker listener"):
        listeners.check(change)
    # The external listener is no other broker's: a key store of another CA is taken there.
    listeners.reconfigure({KEYSTORE: str(other_ca_cert.p12)})


def test_reconfigurable_names() -> None:
    assert is_reconfigurable("ssl.keystore.location")
    assert is_reconfigurable("listener.name.external.ssl.truststore.certificates")
    assert not is_reconfigurable("ssl.client.auth")
    assert not is_reconfigurable("listener.name.external.ssl.principal.mapping.rules")
