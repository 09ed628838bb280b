"""Request bodies whose SigV4 payload hash is computed where they are read, off the event loop.

botocore signs an S3 body with its SHA-256, always over plain HTTP and over HTTPS
whenever no checksum header goes with it (the plugin sends none; see its checksum
setting). It hashes on the event loop, about 5 ms per 8 MiB here, while produce
and fetch wait. The plugin reads (and encodes) every log body in an executor thread
anyway: `HashedBody` hashes it there too (hashlib releases the GIL), and the signer that
`sign_prehashed_payloads` selects for PutObject and UploadPart takes that hash
instead of computing it again. The request on the wire is the same.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import botocore.auth
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.handlers import set_operation_specific_signer

PREHASHED_S3V4 = "s3v4-prehashed"
OPERATIONS = ("PutObject", "UploadPart")


class HashedBody(io.BytesIO):
    """A request body and the hex SHA-256 of its bytes, taken when it was read.

    A BytesIO, as botocore makes of any bytes body, so it is sent as before.
    """

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sha256 = hashlib.sha256(data).hexdigest()


class PrehashedS3SigV4Auth(S3SigV4Auth):  # type: ignore[misc]  # botocore is untyped
    """S3's SigV4 signer, taking a `HashedBody`'s hash where it would hash the body itself."""

    def payload(self, request: AWSRequest) -> str:
        body = request.body
        # botocore's own tests for hashing a body (aiobotocore pins botocore's version).
        if (
            isinstance(body, HashedBody)
            and not self._is_streaming_checksum_payload(request)
            and self._should_sha256_sign_payload(request)
        ):
            return body.sha256
        digest: str = super().payload(request)
        return digest


botocore.auth.AUTH_TYPE_MAPS.setdefault(PREHASHED_S3V4, PrehashedS3SigV4Auth)


def sign_prehashed_payloads(events: Any) -> None:
    """Have a client's uploads signed by `PrehashedS3SigV4Auth` (`events`: `client.meta.events`)."""
    for operation in OPERATIONS:
        events.register(f"choose-signer.s3.{operation}", _choose_signer)


def _choose_signer(**kwargs: Any) -> str | None:
    """The operation's own signer (botocore's choice), its S3 SigV4 swapped for ours."""
    chosen: str | None = set_operation_specific_signer(**kwargs)
    return PREHASHED_S3V4 if chosen == "s3v4" else chosen
