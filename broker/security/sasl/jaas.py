"""Kafka's JAAS configuration syntax (`sasl.jaas.config`), parsed as Kafka's `JaasConfig`.

    <login module class> <flag> [<key>=<value> ...];  [more entries]

The flag is one of required, requisite, sufficient, optional; values are quoted (`"..."` or
`'...'`, backslash escapes) or bare words; `//` and `/* */` comments are skipped. The broker
reads only options: a PLAIN listener's `user_<name>="<password>"` entries, and the
inter-broker client's `username` / `password`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

CONTROL_FLAGS = frozenset({"required", "requisite", "sufficient", "optional"})
PLAIN_USER_PREFIX = "user_"

_TOKEN = re.compile(
    r"""
    \s+ | //[^\n]* | /\*.*?\*/          # skipped
    | (?P<quoted>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<word>[A-Za-z0-9_.$\-\u0080-\uffff]+)
    | (?P<char>[=;])
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}


class JaasConfigError(ValueError):
    """`sasl.jaas.config` does not parse; the message says where."""


@dataclass(frozen=True, slots=True)
class LoginModuleEntry:
    login_module: str
    control_flag: str
    options: Mapping[str, str]


def parse_jaas_config(text: str) -> tuple[LoginModuleEntry, ...]:
    """Every entry of `text`; JaasConfigError when it is not Kafka's syntax."""
    tokens = _tokens(text)
    entries = []
    i = 0
    while i < len(tokens):
        module, kind = tokens[i]
        if kind != "word":
            raise JaasConfigError(f"expected a login module class in JAAS config, found {module!r}")
        if i + 1 >= len(tokens):
            raise JaasConfigError("Login module control flag not specified in JAAS config")
        flag = tokens[i + 1][0]
        if flag.lower() not in CONTROL_FLAGS:
            raise JaasConfigError(f"Invalid login module control flag '{flag}' in JAAS config")
        i += 2
        options: dict[str, str] = {}
        while i < len(tokens) and tokens[i] != (";", "char"):
            key = tokens[i][0]
            if tokens[i + 1 : i + 2] != [("=", "char")] or i + 2 >= len(tokens):
                raise JaasConfigError(f"Value not specified for key '{key}' in JAAS config")
            value, value_kind = tokens[i + 2]
            if value_kind == "char":
                raise JaasConfigError(f"Value not specified for key '{key}' in JAAS config")
            options[key] = value
            i += 3
        if i >= len(tokens):
            raise JaasConfigError("JAAS config entry not terminated by semi-colon")
        i += 1
        entries.append(LoginModuleEntry(module, flag.lower(), options))
    if not entries:
        raise JaasConfigError("Login module not specified in JAAS config")
    return tuple(entries)


def jaas_options(text: str) -> dict[str, str]:
    """The options of every entry of `text`, merged (a broker's config has one entry)."""
    merged: dict[str, str] = {}
    for entry in parse_jaas_config(text):
        merged.update(entry.options)
    return merged


def plain_users(options: Mapping[str, str]) -> dict[str, str]:
    """PLAIN's users, from `user_<name>="<password>"` options."""
    return {
        key[len(PLAIN_USER_PREFIX) :]: value
        for key, value in options.items()
        if key.startswith(PLAIN_USER_PREFIX) and len(key) > len(PLAIN_USER_PREFIX)
    }


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise JaasConfigError(
                f"unexpected {text[position]!r} at character {position} of the JAAS config"
            )
        position = match.end()
        if match["quoted"] is not None:
            body = match["quoted"][1:-1]
            tokens.append((_ESCAPE.sub(lambda m: _ESCAPES.get(m[1], m[1]), body), "quoted"))
        elif match["word"] is not None:
            tokens.append((match["word"], "word"))
        elif match["char"] is not None:
            tokens.append((match["char"], "char"))
    return tokens
