"""The TLS principal: Kafka's SslPrincipalMapper rules (its own tests, ported) and the
certificate subject in Java's RFC 2253 form, checked against Java itself."""

from __future__ import annotations

import pytest
from cryptography import x509

from tests.apache_kafka import run_java
from tests.certs import session_certs
from tierbroker.broker.security.distinguished_name import distinguished_name
from tierbroker.broker.security.principal import ANONYMOUS, KafkaPrincipal
from tierbroker.broker.security.ssl_principal import (
    NoMatchingRule,
    SslPrincipalBuilder,
    SslPrincipalMapper,
)


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_valid_rules(rules: str) -> None:
    SslPrincipalMapper(rules)


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
        "RULE:^CN=(unclosed/$1/",
    ],
)
def test_invalid_rules(rules: str) -> None:
    with pytest.raises(ValueError):
        SslPrincipalMapper(rules)


def test_rules_map_subjects_as_kafka() -> None:
    mapper = SslPrincipalMapper(
        ", ".join(
            [
                "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
                "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
                "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
                "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
                "DEFAULT",
            ]
        )
    )
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    unmapped = "OU=JavaSoft,O=Sun Microsystems,C=US"
    assert mapper.name(unmapped) == unmapped


def test_escaped_comma_in_a_rule() -> None:
    mapper = SslPrincipalMapper("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name("CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"


@pytest.mark.parametrize(
    ("rules", "count"),
    [
        ("", 0),
        (",   , , ,      , , ,   ", 0),
        (",,RULE://,,,DEFAULT,,", 2),
        ("  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ", 3),
    ],
)
def test_rules_splitting(rules: str, count: int) -> None:
    assert len(SslPrincipalMapper(rules).rules) == count


def test_group_references_beyond_the_pattern_are_literal() -> None:
    # Kafka escapes $4 when the pattern has 3 groups; $12 with 2 groups is group 1, then "2".
    three = SslPrincipalMapper("RULE:^CN=(.*?),O=(.*?),C=(.*?)$/$1@$4/")
    assert three.name("CN=a,O=b,C=c") == "a@$4"
    two = SslPrincipalMapper("RULE:^CN=(.*?),O=(.*?)$/$12/")
    assert two.name("CN=a,O=b") == "a2"
    escaped = SslPrincipalMapper("RULE:^CN=(.*?)$/\\$1-$1/")
    assert escaped.name("CN=a") == "$1-a"


def test_no_matching_rule_fails() -> None:
    with pytest.raises(NoMatchingRule, match="CN=x"):
        SslPrincipalMapper("RULE:^CN=(.*?),O=y$/$1/").name("CN=x")


def test_principal_of_a_client_certificate() -> None:
    certs = session_certs()
    cert = x509.load_pem_x509_certificate(certs.client.cert.read_bytes())
    builder = SslPrincipalBuilder(SslPrincipalMapper())
    assert builder.certificate_principal(cert) == KafkaPrincipal(
        "User", "CN=client,O=tierbroker-tests"
    )
    mapped = SslPrincipalBuilder(SslPrincipalMapper("RULE:^CN=([^,]*),.*$/$1/U"))
    assert str(mapped.certificate_principal(cert)) == "User:CLIENT"
    assert builder.principal(None) == ANONYMOUS


def test_distinguished_names_match_javas() -> None:
    """Subjects with Java's keywords, an e-mail address (an OID, hex), characters Java
    escapes, spaces at both ends, a multi-valued RDN and UTF-8: as X500Principal.getName()."""
    certs = session_certs()
    subjects = [
        "/C=US/ST=CA/L=Palo Alto/O=Acme, Inc./OU=Eng/CN=alice",
        "/DC=com/DC=example/UID=bob/CN=bob+OU=ops",
        "/CN=carol/emailAddress=carol@example.com",
        '/CN= padded =#;<>"+\\\\ /O=x',
        "/CN=Jürgen/street=1 Main St",
    ]
    files = [certs.client_cert(f"dn-{i}", s).cert for i, s in enumerate(subjects)]
    ours = [distinguished_name(x509.load_pem_x509_certificate(f.read_bytes())) for f in files]
    javas = run_java("SubjectNames.java", *map(str, files)).splitlines()
    assert ours == javas
    assert ours[0] == "CN=alice,OU=Eng,O=Acme\\, Inc.,L=Palo Alto,ST=CA,C=US"
