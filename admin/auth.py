"""Admin tokens: JWTs verified with Authlib (``authlib.jose``, imported through ``admin.jose``).

- HS256 tokens signed with ``settings.admin_jwt_secret`` (``pagegate admin token`` mints them).
- RS256/ES256 (and the other RSA/EC algorithms) tokens from a company IdP, verified against the
  JWKS at ``settings.admin_jwks_url`` by the header's ``kid``.

Every token must carry ``sub``, ``exp`` (enforced, a finite number) and ``iss`` equal to
``settings.admin_jwt_issuer``. An ``aud`` claim must name ``settings.admin_jwt_audience`` (a token
an identity provider issued for another API is refused); an identity provider's token must carry
one, while an HS256 token (the server's own secret) may go without. Scopes come from ``scope`` (space-separated, RFC 8693) or ``scp``
(a list, as Okta and Entra ID issue them). ``admin:write`` implies ``admin:read``.
Failures raise ``ApiError``: 401 ``invalid_token`` for a missing, malformed, expired, badly signed
or unknown-``kid`` token; 403 ``insufficient_scope`` for a valid token without the scope.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field

from admin.jose import ExpiredTokenError, JoseError, JsonWebToken, Key, MissingClaimError
from admin.jwks import JwksError, JwksSource
from gateway.errors import ApiError
from gateway.log_throttle import LogThrottle
from gateway.settings import Settings

log = logging.getLogger("pagegate.admin")
_JWKS_LOG = LogThrottle()  # one line per 10 s

SCOPE_READ = "admin:read"
SCOPE_WRITE = "admin:write"
ALL_SCOPES = (SCOPE_READ, SCOPE_WRITE)
HMAC_ALGS = ("HS256",)
# the JWK key type each asymmetric algorithm needs (a mismatched key is refused before verifying)
ASYMMETRIC_ALGS = {"RS256": "RSA", "RS384": "RSA", "RS512": "RSA", "PS256": "RSA",
                   "ES256": "EC", "ES384": "EC", "ES512": "EC"}
LEEWAY_S = 30  # clock skew tolerated on exp/nbf/iat
MAX_TOKEN_TTL_S = 365 * 24 * 3600  # minted tokens live at most a year: a leaked one must not last for ever


@dataclass(frozen=True, slots=True)
class AdminPrincipal:
    """Who is calling the admin API: the token's subject and granted scopes."""

    subject: str
    scopes: frozenset[str]
    claims: dict = field(default_factory=dict, compare=False)

    def has(self, scope: str) -> bool:
        return scope in self.scopes or (scope == SCOPE_READ and SCOPE_WRITE in self.scopes)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_token",
                    headers={"www-authenticate": 'Bearer realm="pagegate-admin"'})


def forbidden(scope: str) -> ApiError:
    return ApiError(403, f"This admin token lacks the '{scope}' scope.", "permission_error",
                    "insufficient_scope",
                    headers={"www-authenticate": f'Bearer error="insufficient_scope", scope="{scope}"'})


def require(principal: AdminPrincipal, scope: str) -> AdminPrincipal:
    if not principal.has(scope):
        raise forbidden(scope)
    return principal


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value; None for any other."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


MAX_SUBJECT_CHARS = 256  # a token's subject: who the audit log says made a change


def mint_token(settings: Settings, *, subject: str = "admin", scopes: tuple[str, ...] | list[str] = ALL_SCOPES,
               ttl_s: int | None = None, now: int | None = None) -> str:
    """An HS256 admin token signed with ``settings.admin_jwt_secret``."""
    if not settings.admin_jwt_secret:
        raise ValueError("PAGEGATE_ADMIN_JWT_SECRET is empty: set the server's secret to mint a token with it")
    if not subject.strip() or len(subject) > MAX_SUBJECT_CHARS or not subject.isprintable():
        raise ValueError(f"a token's subject must be 1 to {MAX_SUBJECT_CHARS} printable characters")
    unknown = set(scopes) - set(ALL_SCOPES)
    if unknown:
        raise ValueError(f"unknown scope(s): {', '.join(sorted(unknown))}")
    issued = int(time.time()) if now is None else now
    ttl = settings.admin_token_ttl_s if ttl_s is None else ttl_s
    if ttl > MAX_TOKEN_TTL_S:  # (a negative ttl mints an expired token, which tests use)
        raise ValueError(f"a token's lifetime is at most {MAX_TOKEN_TTL_S} seconds (one year), not {ttl}")
    claims = {"iss": settings.admin_jwt_issuer, "aud": settings.admin_jwt_audience, "sub": subject, "iat": issued,
              "exp": issued + ttl, "scope": " ".join(scopes), "jti": uuid.uuid4().hex}
    return JsonWebToken(["HS256"]).encode({"alg": "HS256"}, claims, settings.admin_jwt_secret.encode()).decode()


def _peek(token: str) -> dict:
    """The token's header, once its header and claims are seen to be JSON objects (found by QA:
    claims that were no object, signed with the right secret, were reported as a bad signature)."""
    parts = token.split(".")
    try:
        header, claims = (json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))) for p in parts[:2])
    except (ValueError, IndexError, RecursionError) as exc:  # (nested deep: found by a re-check, a 500)
        raise unauthorized("The admin token is malformed.") from exc
    if not isinstance(header, dict) or len(parts) != 3:
        raise unauthorized("The admin token is malformed.")
    if not isinstance(claims, dict):
        raise unauthorized("The admin token is malformed: its claims are not a JSON object.")
    return header


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range (a review: 1 and 400 zeros was a 500)
        return False


def _audiences(claims: dict) -> list | None:
    aud = claims.get("aud")
    return None if aud is None else aud if isinstance(aud, list) else [aud]


def _scopes(claims: dict) -> frozenset[str]:
    raw = claims.get("scope", claims.get("scp", ""))
    if isinstance(raw, str):
        return frozenset(raw.split())
    if isinstance(raw, list):
        return frozenset(s for s in raw if isinstance(s, str))
    return frozenset()


class AdminTokenVerifier:
    """Checks admin bearer tokens. One per app; holds the cached JWKS."""

    def __init__(self, settings: Settings, *, jwks: JwksSource | None = None) -> None:
        self.settings = settings
        # the built-in placeholder is public (it is in the source): outside dev mode (`make run`)
        # no HS256 token is taken with it (found by QA: anyone could mint admin:write tokens)
        placeholder = settings.placeholder_admin_secret
        # an empty secret signs nothing: HS256 is off (identity-provider tokens may still be taken)
        self._hmac_off = ("PAGEGATE_ADMIN_JWT_SECRET is empty" if not settings.admin_jwt_secret else
                          "PAGEGATE_ADMIN_JWT_SECRET is the built-in placeholder" if placeholder and not settings.dev_mode
                          else None)
        self._hmac: bytes | None = None if self._hmac_off else settings.admin_jwt_secret.encode()
        # a dev server on the placeholder says so when a token signed otherwise is refused (found by
        # QA: the README's example exports a secret of its own, and the 401 gave no clue); the
        # placeholder is public already, and dev mode serves loopback only
        self._bad_signature = "The admin token's signature is invalid." + (
            " This server runs in dev mode on the built-in secret: mint tokens with PAGEGATE_ADMIN_JWT_SECRET "
            "unset, or start the server with yours." if placeholder and settings.dev_mode else "")
        # one decoder per algorithm: a token is checked only with the algorithm its key is for
        self._jwt = {alg: JsonWebToken([alg]) for alg in (*HMAC_ALGS, *ASYMMETRIC_ALGS)}
        self.jwks = jwks or (JwksSource(settings.admin_jwks_url) if settings.admin_jwks_url else None)
        self._claims_options = {"iss": {"essential": True, "value": settings.admin_jwt_issuer},
                                "sub": {"essential": True}, "exp": {"essential": True}}

    async def verify(self, token: str | None) -> AdminPrincipal:
        if not token:
            raise unauthorized("Missing admin bearer token (Authorization: Bearer <jwt>).")
        header = _peek(token)
        alg = header.get("alg")
        if not isinstance(alg, str):
            raise unauthorized("The admin token is malformed (no 'alg' header).")
        if alg in HMAC_ALGS:
            if self._hmac is None:
                raise unauthorized(f"HS256 admin tokens are refused: {self._hmac_off}; set a secret of your own "
                                   "on the server (and for `pagegate admin token`).")
            key: bytes | Key = self._hmac
        elif alg in ASYMMETRIC_ALGS:
            key = await self._jwks_key(header.get("kid"), ASYMMETRIC_ALGS[alg])
        else:
            raise unauthorized(f"Admin tokens signed with {alg!r} are not accepted.")
        try:
            claims = self._jwt[alg].decode(token, key, claims_options=self._claims_options)
        except (JoseError, ValueError, TypeError, KeyError) as exc:  # bad signature or undecodable
            raise unauthorized(self._bad_signature) from exc
        for name in ("exp", "nbf", "iat"):  # (found by QA: an exp of 1e400 or NaN never expired)
            value = claims.get(name)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)
                                      or not _finite(value)):
                raise unauthorized(f"The admin token's claims are invalid: '{name}' must be a finite number.")
        audiences = _audiences(claims)
        audience = self.settings.admin_jwt_audience
        if audiences is None and alg not in HMAC_ALGS:
            # (found by QA: any token of the company's identity provider with a scope named
            # admin:write was taken, whatever API it had been issued for)
            raise unauthorized(f"The admin token lacks a required claim: aud (an identity provider's token must "
                               f"name this server's audience, '{audience}': PAGEGATE_ADMIN_JWT_AUDIENCE).")
        if audiences is not None and audience not in audiences:
            raise unauthorized(f"The admin token is for another audience: its 'aud' must name '{audience}' "
                               "(PAGEGATE_ADMIN_JWT_AUDIENCE).")
        try:
            claims.validate(leeway=LEEWAY_S)
        except ExpiredTokenError as exc:
            raise unauthorized("The admin token has expired.") from exc
        except MissingClaimError as exc:
            raise unauthorized(f"The admin token lacks a required claim: {exc.description}") from exc
        except JoseError as exc:
            raise unauthorized(f"The admin token's claims are invalid: {exc.description}") from exc
        sub = claims["sub"]
        if not isinstance(sub, str):
            raise unauthorized("The admin token's claims are invalid: 'sub' must be a string.")
        # it is the audit log's actor, printed by the CLI and stored by PostgreSQL (found by QA: a NUL
        # was a 500, a line break forged a line of `pagegate admin audit`)
        if not sub.strip() or len(sub) > MAX_SUBJECT_CHARS or not sub.isprintable():
            raise unauthorized(f"The admin token's claims are invalid: 'sub' must be 1 to {MAX_SUBJECT_CHARS} "
                               "printable characters.")
        return AdminPrincipal(subject=claims["sub"], scopes=_scopes(claims), claims=dict(claims))

    async def _jwks_key(self, kid: str | None, kty: str) -> Key:
        if self.jwks is None:
            raise unauthorized("Asymmetric admin tokens need PAGEGATE_ADMIN_JWKS_URL to be configured.")
        if not kid or not isinstance(kid, str):
            raise unauthorized("The admin token has no 'kid' header.")
        try:
            key = await self.jwks.get(kid)
        except JwksError as exc:
            # the detail (a URL, a path, the error) is the operator's, in the log; not for any caller
            # (found by a security QA: a URL's credentials were in the reply)
            _JWKS_LOG.log(log, logging.WARNING, "admin tokens: %s", exc)
            raise unauthorized("The admin key set (PAGEGATE_ADMIN_JWKS_URL) is unavailable; the server's "
                               "log says why.") from exc
        if key is None:
            raise unauthorized(f"Unknown admin signing key id {kid!r}.")
        if key.kty != kty:
            raise unauthorized(f"Admin signing key {kid!r} is not an {kty} key.")
        return key
