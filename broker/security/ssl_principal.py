"""The principal of a TLS connection, as Kafka's `DefaultKafkaPrincipalBuilder` makes it.

`User:` and the client certificate's subject (`distinguished_name`, Java's RFC 2253 form)
after `ssl.principal.mapping.rules`; ANONYMOUS when the client gave no certificate
(`ssl.client.auth` none or requested).

The rules are Kafka's `SslPrincipalMapper`: a comma-separated list of `DEFAULT` (the
subject as it is) and `RULE:pattern/replacement/` with an optional `L` or `U` after the
last slash (lower or upper case the result); the first rule whose pattern matches the
whole subject gives the name; none matching fails the connection. Patterns are Python
regular expressions (Java's for the usual ones); in a replacement `$1` is a group and a
backslash makes the next character literal, as in Java's `replaceAll`; a `$n` beyond the
pattern's groups is literal text, as Kafka makes it.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass

from cryptography import x509

from tierbroker.broker.security.distinguished_name import distinguished_name
from tierbroker.broker.security.principal import ANONYMOUS, USER_TYPE, KafkaPrincipal

DEFAULT_RULES = "DEFAULT"
# Kafka's SslPrincipalMapper.RULE_PATTERN, with its groups numbered as there.
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_PARSER = re.compile(_RULE)


class NoMatchingRule(Exception):
    """No rule of `ssl.principal.mapping.rules` applies to a subject."""


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "L", "U" or ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        result = self.pattern.sub(lambda m: _expand(self.replacement, m), name)
        return (
            result.lower() if self.case == "L" else result.upper() if self.case == "U" else result
        )


class SslPrincipalMapper:
    """`ssl.principal.mapping.rules`, parsed; ValueError names a rule that is not one."""

    def __init__(self, rules: str | None = None) -> None:
        self.rules = [_parse(r) for r in _split(DEFAULT_RULES if rules is None else rules)]

    def name(self, distinguished: str) -> str:
        for rule in self.rules:
            found = rule.apply(distinguished)
            if found is not None:
                return found
        raise NoMatchingRule(f"no rule of ssl.principal.mapping.rules applies to {distinguished}")


@dataclass(frozen=True, slots=True)
class SslPrincipalBuilder:
    """Principals of a TLS listener's connections."""

    mapper: SslPrincipalMapper

    def principal(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> KafkaPrincipal:
        """The client's principal; `NoMatchingRule` if the rules leave it without one."""
        der = None if ssl_object is None else ssl_object.getpeercert(binary_form=True)
        if not der:
            return ANONYMOUS
        return self.certificate_principal(x509.load_der_x509_certificate(der))

    def certificate_principal(self, cert: x509.Certificate) -> KafkaPrincipal:
        return KafkaPrincipal(USER_TYPE, self.mapper.name(distinguished_name(cert)))


def _split(rules: str) -> list[str]:
    return [m.group(1) for m in _SPLITTER.finditer(rules.strip()) if m.group(1)]


def _parse(rule: str) -> _Rule:
    match = _PARSER.match(rule)
    if match is None or match.end() != len(rule):
        rest = rule if match is None else rule[match.end() :]
        raise ValueError(f"invalid rule {rule!r} (unmatched: {rest!r})")
    if match.group(1):
        return _Rule(None)
    if match.group(2) is None:
        raise ValueError(f"invalid rule {rule!r}: use DEFAULT or RULE:pattern/replacement/[LU]")
    try:
        pattern = re.compile(match.group(2))
    except re.error as e:
        raise ValueError(f"invalid rule {rule!r}: its pattern does not compile ({e})") from None
    return _Rule(pattern, match.group(4), match.group(6))


def _expand(replacement: str, match: re.Match[str]) -> str:
    """Java's `Matcher.appendReplacement` of `replacement`, with Kafka's rule that a group
    reference beyond the pattern's groups is literal."""
    groups = len(match.groups())
    out: list[str] = []
    i = 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\" and i + 1 < len(replacement):
            out.append(replacement[i + 1])
            i += 2
        elif c == "$" and i + 1 < len(replacement) and replacement[i + 1].isdigit():
            digits = i + 1
            while digits < len(replacement) and replacement[digits].isdigit():
                digits += 1
            number, end = _group_reference(replacement[i + 1 : digits], groups)
            if number is None:
                out.append(replacement[i:digits])  # Kafka escapes it: literal
                i = digits
            else:
                out.append(match.group(number) or "")
                i = i + 1 + end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _group_reference(digits: str, groups: int) -> tuple[int | None, int]:
    """(group, digits it takes) of `$<digits>`: Java takes digits while they name a group;
    None (the reference is literal, as Kafka escapes it) if the first digit names none."""
    number, used = int(digits[0]), 1
    if number > groups:
        return None, len(digits)
    while used < len(digits) and number * 10 + int(digits[used]) <= groups:
        number = number * 10 + int(digits[used])
        used += 1
    return number, used
