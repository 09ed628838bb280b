"""OAUTHBEARER tokens signed by an identity provider, checked against its JWKS (Kafka's
KIP-768 broker validator, `sasl.oauthbearer.jwks.endpoint.url`).

The key set is fetched when first needed and again once `sasl.oauthbearer.jwks.endpoint.
refresh.ms` old, or when a token names a key it lacks (at most once per
`MIN_REFETCH_S`): one fetch at a time, in a worker thread, bounded by a timeout; a failed
refresh keeps the keys held. A token must be signed with an asymmetric algorithm by one of
those keys, unexpired (within `sasl.oauthbearer.clock.skew.seconds`), for the expected
audience and issuer when they are set, and name its principal in
`sasl.oauthbearer.sub.claim.name`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import jwt

from tierbroker.broker.security.sasl.oauthbearer import InvalidTokenError, ValidToken

log = logging.getLogger(__name__)

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
FETCH_TIMEOUT_S = 10.0
MIN_REFETCH_S = 10.0
MAX_JWKS_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class JwksSettings:
    url: str
    refresh_ms: int = 3_600_000
    expected_audience: tuple[str, ...] = ()
    expected_issuer: str | None = None
    clock_skew_s: int = 30
    sub_claim_name: str = "sub"


class JwksValidator:
    """Validates signed tokens; shared by every connection of a listener (one event loop)."""

    def __init__(self, settings: JwksSettings, fetch_timeout_s: float = FETCH_TIMEOUT_S) -> None:
        self.settings = settings
        self._fetch_timeout_s = fetch_timeout_s
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_s = float("-inf")  # monotonic time of the last fetch tried
        self._lock = asyncio.Lock()

    async def validate(self, token: str) -> ValidToken:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise InvalidTokenError(f"malformed token: {e}") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise InvalidTokenError(f"token signed with {alg!r}, not one of {ALGORITHMS}")
        key = await self._key_for(header.get("kid"))
        s = self.settings
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=list(s.expected_audience) or None,
                issuer=s.expected_issuer,
                leeway=s.clock_skew_s,
                options={"require": ["exp"], "verify_aud": bool(s.expected_audience)},
            )
        except jwt.PyJWTError as e:
            raise InvalidTokenError(f"token refused: {e}") from None
        principal = claims.get(s.sub_claim_name)
        if not isinstance(principal, str) or not principal.strip():
            raise InvalidTokenError(f"No principal name in JWT claim: {s.sub_claim_name}")
        return ValidToken(principal, int(claims["exp"] * 1000))

    async def _key_for(self, kid: str | None) -> jwt.PyJWK:
        now_s = time.monotonic()
        stale = now_s - self._fetched_s >= self.settings.refresh_ms / 1000
        unknown = kid not in self._keys and now_s - self._fetched_s >= MIN_REFETCH_S
        if stale or unknown:
            await self._refresh(now_s)
        key = self._keys.get(kid)
        if key is None and kid is None and len(self._keys) == 1:
            key = next(iter(self._keys.values()))
        if key is None:
            raise InvalidTokenError(f"no key {kid!r} in the JWKS of {self.settings.url}")
        return key

    async def _refresh(self, asked_s: float) -> None:
        async with self._lock:
            if self._fetched_s >= asked_s:  # fetched while this one waited
                return
            self._fetched_s = time.monotonic()
            try:
                async with asyncio.timeout(self._fetch_timeout_s):
                    document = await asyncio.to_thread(
                        _fetch, self.settings.url, self._fetch_timeout_s
                    )
                keys = jwt.PyJWKSet.from_dict(document).keys
            except (TimeoutError, OSError, ValueError, jwt.PyJWTError) as e:
                log.warning(
                    "could not fetch the JWKS from %s (sasl.oauthbearer.jwks.endpoint.url): %s; "
                    "keeping the %d keys held",
                    self.settings.url,
                    e,
                    len(self._keys),
                )
                return
            self._keys = {k.key_id: k for k in keys}


def _fetch(url: str, timeout_s: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        document = json.loads(response.read(MAX_JWKS_BYTES))
    if not isinstance(document, dict):
        raise ValueError("a JWKS is a JSON object")
    return document
