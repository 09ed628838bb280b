"""How the S3 plugin reads S3's errors: worth another attempt, a missing object, or a
configuration mistake.

Throttling (SlowDown, 429, Throttling*), 5xx, timeouts and connection errors pass
with time and are retried. A missing bucket, refused or unknown credentials, or a
bucket in another region never pass on their own: `explain` turns them into one
sentence naming the bucket and the broker property that fixes them (the plugin's
settings are `rsm.config.*` properties of the broker).
"""

from __future__ import annotations

import ssl

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

PROPERTY_PREFIX = "rsm.config."  # the broker's prefix of the plugin's settings
BUCKET_PROPERTY = PROPERTY_PREFIX + "storage.s3.bucket.name"
ENDPOINT_PROPERTY = PROPERTY_PREFIX + "storage.s3.endpoint.url"
REGION_PROPERTY = PROPERTY_PREFIX + "storage.s3.region"
KEY_ID_PROPERTY = PROPERTY_PREFIX + "storage.aws.access.key.id"
SECRET_PROPERTY = PROPERTY_PREFIX + "storage.aws.secret.access.key"
CA_BUNDLE_PROPERTY = PROPERTY_PREFIX + "storage.s3.ca.bundle"

# Error codes worth another attempt (besides HTTP 429, 5xx and anything named Throttl*).
RETRIABLE_CODES = frozenset(
    {
        "SlowDown",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "OperationAborted",
        "PriorRequestNotComplete",
    }
)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound"})
# Connection trouble, timeouts and truncated responses (botocore, aiohttp or the OS).
RETRIABLE_EXCEPTIONS: tuple[type[BaseException], ...] = (
    HTTPClientError,
    BotoConnectionError,
    IncompleteReadError,
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)

# A HEAD answer has no body, so HeadBucket's code is its HTTP status.
_MISSING_BUCKET = frozenset({"NoSuchBucket", "404"})
_DENIED = frozenset({"AccessDenied", "AllAccessDisabled", "AccountProblem", "403"})
_EXPIRED = frozenset({"ExpiredToken", "InvalidToken", "TokenRefreshRequired"})
_WRONG_REGION = frozenset(
    {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}
)


def error_code(error: ClientError) -> tuple[str, int]:
    """The S3 error code and HTTP status of a failed call (status 0 if unknown)."""
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, int(status) if isinstance(status, int) else 0


def is_retriable(code: str, status: int) -> bool:
    """Whether S3 asks to try again: throttling, a timeout, or a server error."""
    return (
        code in RETRIABLE_CODES
        or code.startswith("Throttl")
        or status == 429
        or (status >= 500 and status != 501)
    )


def explain(code: str, status: int, bucket: str, where: str) -> str | None:
    """The configuration mistake an S3 error answer reveals, with the property that fixes
    it; None if the error is not one. `where` names the bucket and its endpoint."""
    if code in _MISSING_BUCKET:
        return f"{where} does not exist: create it, or fix {BUCKET_PROPERTY}"
    if code == "InvalidBucketName":
        return f"'{bucket}' is not a valid bucket name: fix {BUCKET_PROPERTY}"
    if code == "InvalidAccessKeyId":
        return f"{where}: the access key id is not known there: fix {KEY_ID_PROPERTY}"
    if code == "SignatureDoesNotMatch":
        return f"{where}: the secret key does not match the access key id: fix {SECRET_PROPERTY}"
    if code in _EXPIRED:
        return f"{where}: the AWS credentials have expired: renew them"
    if code in _DENIED or status == 403:
        return (
            f"{where}: access denied: check the credentials ({KEY_ID_PROPERTY}, "
            f"{SECRET_PROPERTY}) and the bucket's policy"
        )
    if code in _WRONG_REGION or status == 301:
        return f"{where} is in another region: fix {REGION_PROPERTY}"
    return None


def explain_client_error(error: BotoCoreError) -> str | None:
    """The configuration mistake a client-side botocore error reveals, or None."""
    if isinstance(error, NoCredentialsError | PartialCredentialsError):
        return (
            f"no AWS credentials: set {KEY_ID_PROPERTY} and {SECRET_PROPERTY}, "
            "or give the broker the default AWS credential chain"
        )
    return None


_CERTIFICATE_ERRORS = (ssl.SSLCertVerificationError, aiohttp.ClientConnectorCertificateError)


def untrusted_certificate(error: BaseException, where: str) -> str | None:
    """Why the endpoint's TLS certificate was refused (not signed by a trusted CA, or not
    for the endpoint's host), with the property that fixes it; None for another error.
    Time does not fix it: not retried."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, _CERTIFICATE_ERRORS):
            return (
                f"{where}: the endpoint's TLS certificate is not trusted ({cause}): set "
                f"{CA_BUNDLE_PROPERTY} to the CA bundle that signed it, or fix "
                f"{ENDPOINT_PROPERTY}"
            )
        # botocore keeps the HTTP library's error in its `error` keyword.
        wrapped = getattr(cause, "kwargs", {}).get("error")
        if not isinstance(wrapped, BaseException):
            wrapped = cause.__cause__ or cause.__context__
        cause = wrapped
    return None
