"""Helpers shared by the admin tests (imported by name: tests/admin is on sys.path)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

from gateway.db.models import UsageRecord

SECRET = "admin-tests-secret-0123456789-abcdefghijklmnop"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def usage_row(*, tenant_id: int, key_id: int | None, model: str, when: datetime, prompt: int, cached: int,
              completion: int, cost: str, saved: str = "0", latency: float, cache: str = "miss") -> UsageRecord:
    return UsageRecord(request_id=uuid.uuid4().hex, created_at=when.astimezone(UTC), tenant_id=tenant_id,
                       api_key_id=key_id, model=model, prompt_tokens=prompt, cached_prompt_tokens=cached,
                       completion_tokens=completion, cost_usd=Decimal(cost), saved_usd=Decimal(saved),
                       latency_ms=latency, ttft_ms=latency / 4, status="ok", finish_reason="stop", cache=cache)


def sign(header: dict, claims: dict, key) -> str:
    """A JWT signed with Authlib (``key``: secret bytes or an authlib JWK), as a string. The
    header's ``kid`` wins over the key's own (authlib would write the key's), so tests can forge one."""
    from admin.jose import JsonWebKey, JsonWebToken

    if "kid" in header and getattr(key, "kid", None) not in (None, header["kid"]):
        key = JsonWebKey.import_key({**key.as_dict(is_private=True), "kid": header["kid"]})
    return JsonWebToken([header["alg"]]).encode(dict(header), dict(claims), key).decode()


def new_jwk(kty: str, kid: str):
    """A private RSA-2048 or EC P-256 key with ``kid``."""
    from admin.jose import JsonWebKey

    crv_or_size = 2048 if kty == "RSA" else "P-256"
    return JsonWebKey.generate_key(kty, crv_or_size, is_private=True, options={"kid": kid})


def public_jwk(key) -> dict:
    return key.as_dict(is_private=False)
