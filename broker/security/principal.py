"""`KafkaPrincipal`: the identity a connection authenticated as, in Kafka's `Type:name` form."""

from __future__ import annotations

from dataclasses import dataclass

USER_TYPE = "User"


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """`User:alice` (the name may itself hold colons, as a DN does); ValueError otherwise."""
        principal_type, sep, name = text.strip().partition(":")
        if not sep or not principal_type or not name:
            raise ValueError(f"{text!r} is not a principal: expected Type:name, e.g. User:alice")
        return cls(principal_type, name)


# What PLAINTEXT connections, and SSL ones without a client certificate, are.
ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")
