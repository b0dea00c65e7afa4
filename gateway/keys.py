"""API keys: ``pg-`` + 32 random bytes in base62. Only the SHA-256 hash and a short display
prefix are stored; the full key is shown once."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
KEY_PREFIX = "pg-"
DISPLAY_PREFIX_LEN = 10  # "pg-" + 7 characters


def _base62(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 62)
        out.append(_ALPHABET[r])
    return "".join(reversed(out)).rjust(43, "0")  # 32 bytes need at most 43 base62 digits


@dataclass(frozen=True, slots=True)
class NewKey:
    key: str  # shown once, never stored
    key_hash: str
    prefix: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> NewKey:
    key = KEY_PREFIX + _base62(secrets.token_bytes(32))
    return NewKey(key=key, key_hash=hash_key(key), prefix=key[:DISPLAY_PREFIX_LEN])


def looks_like_key(value: str) -> bool:
    return value.startswith(KEY_PREFIX) and 40 <= len(value) <= 64
