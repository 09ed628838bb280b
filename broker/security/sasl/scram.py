"""SCRAM's arithmetic and stored credentials (RFC 5802; Kafka's ScramFormatter,
ScramCredentialUtils and ScramMechanism).

A credential is kept as Kafka keeps it in ZooKeeper's `/config/users/<user>`:
`salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>`; the password itself
is never stored, only keys derived from `Hi(password, salt, iterations)`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from enum import Enum

from tierbroker.broker.security.sasl.mechanism import SCRAM_SHA_256, SCRAM_SHA_512

MIN_ITERATIONS = 4096  # ScramMechanism.minIterations
MAX_ITERATIONS = 16384  # the most AlterUserScramCredentials accepts
SALT_BYTES = 16


class ScramMechanism(Enum):
    """Name, hash and the type number AlterUserScramCredentials uses (1, 2)."""

    SCRAM_SHA_256 = (SCRAM_SHA_256, "sha256", 1)
    SCRAM_SHA_512 = (SCRAM_SHA_512, "sha512", 2)

    @property
    def mechanism_name(self) -> str:
        return self.value[0]

    @property
    def hash_name(self) -> str:
        return self.value[1]

    @property
    def type_id(self) -> int:
        return self.value[2]

    @classmethod
    def by_name(cls, name: str) -> ScramMechanism | None:
        return next((m for m in cls if m.mechanism_name == name), None)

    @classmethod
    def by_type(cls, type_id: int) -> ScramMechanism | None:
        return next((m for m in cls if m.type_id == type_id), None)

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """Hi(password, salt, i): PBKDF2 with the mechanism's HMAC."""
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode(), salt, iterations)

    def client_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Client Key")

    def server_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Server Key")

    def credential(self, salted_password: bytes, salt: bytes, iterations: int) -> ScramCredential:
        """The stored credential of a salted password (what AlterUserScramCredentials sends)."""
        return ScramCredential(
            salt=salt,
            stored_key=self.hash(self.client_key(salted_password)),
            server_key=self.server_key(salted_password),
            iterations=iterations,
        )

    def new_credential(self, password: str, iterations: int = MIN_ITERATIONS) -> ScramCredential:
        salt = os.urandom(SALT_BYTES)
        return self.credential(self.salted_password(password, salt, iterations), salt, iterations)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def encode(self) -> str:
        """Kafka's text form (ScramCredentialUtils.credentialToString)."""
        b64 = base64.b64encode
        return (
            f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},"
            f"server_key={b64(self.server_key).decode()},iterations={self.iterations}"
        )

    @classmethod
    def decode(cls, text: str) -> ScramCredential:
        """ValueError when `text` is not Kafka's form."""
        fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        try:
            return cls(
                salt=base64.b64decode(fields["salt"], validate=True),
                stored_key=base64.b64decode(fields["stored_key"], validate=True),
                server_key=base64.b64decode(fields["server_key"], validate=True),
                iterations=int(fields["iterations"]),
            )
        except (KeyError, ValueError) as e:
            raise ValueError(f"not a SCRAM credential: {e}") from None


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def sasl_name_to_username(sasl_name: str) -> str:
    """`=2C` and `=3D` back to `,` and `=` (ScramFormatter.username)."""
    return sasl_name.replace("=2C", ",").replace("=3D", "=")


def username_to_sasl_name(username: str) -> str:
    return username.replace("=", "=3D").replace(",", "=2C")
