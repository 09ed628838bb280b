"""Upload bodies hashed where they are read, and the S3 signer that takes that hash."""

from __future__ import annotations

import hashlib
import os

import pytest
from botocore.auth import UNSIGNED_PAYLOAD, S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from tierbroker.storage.remote.s3_payload import HashedBody, PrehashedS3SigV4Auth

CREDENTIALS = Credentials("key", "secret")


def put(url: str, body: bytes | HashedBody, **s3_config: bool) -> AWSRequest:
    request = AWSRequest(method="PUT", url=url, data=body)
    request.context["client_config"] = Config(s3=s3_config or None)
    return request


def hashed(data: bytes, sha256: str | None = None) -> HashedBody:
    body = HashedBody(data)
    body.sha256 = sha256 or body.sha256
    return body


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000/b/k", "https://s3.amazonaws.com/b/k"])
def test_the_signer_takes_the_stored_hash_where_botocore_would_hash(url: str) -> None:
    data = os.urandom(70_000)
    ours = PrehashedS3SigV4Auth(CREDENTIALS, "s3", "us-east-1")
    botocores = S3SigV4Auth(CREDENTIALS, "s3", "us-east-1")
    correct = hashed(data)
    assert correct.sha256 == hashlib.sha256(data).hexdigest()
    assert ours.payload(put(url, correct)) == botocores.payload(put(url, correct))
    # Taken as stored, never computed again (a wrong one shows it).
    assert ours.payload(put(url, hashed(data, "f" * 64))) == "f" * 64
    # Other bodies are hashed as botocore hashes them.
    assert ours.payload(put(url, data)) == botocores.payload(put(url, data))


def test_an_unsigned_payload_stays_unsigned() -> None:
    body = hashed(b"abc", "f" * 64)
    request = put("http://127.0.0.1:9000/b/k", body, payload_signing_enabled=False)
    assert PrehashedS3SigV4Auth(CREDENTIALS, "s3", "us-east-1").payload(request) == UNSIGNED_PAYLOAD
