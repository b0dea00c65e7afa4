"""A JSON Web Key Set read from a URL or a file, cached, and looked up by key id.

Company identity providers publish their signing keys as a JWKS (``/.well-known/jwks.json``)
and rotate them; an unknown ``kid`` therefore triggers one re-read (at most every
``refresh_floor_s``) before the token is refused. Reading never blocks the event loop: URLs are
fetched with ``httpx.AsyncClient``, files are read on a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path

import httpx

from admin.jose import JsonWebKey, Key, KeySet

log = logging.getLogger("pagegate.admin")


class JwksError(Exception):
    """The key set could not be read or parsed."""


class JwksSource:
    """Keys from ``location`` (``https://…``, ``http://…``, ``file://…`` or a plain path).

    Contract: ``await get(kid)`` returns the key with that id or ``None`` when the (freshly
    re-read) set has no such key; it raises ``JwksError`` when the set cannot be read at all.
    """

    def __init__(self, location: str, *, ttl_s: float = 300.0, refresh_floor_s: float = 10.0,
                 timeout_s: float = 5.0) -> None:
        self.location = location
        self.ttl_s = ttl_s
        self.refresh_floor_s = refresh_floor_s
        self.timeout_s = timeout_s
        self._keys: KeySet | None = None
        self._loaded_at = 0.0  # last successful read
        self._tried_at = -float("inf")  # last read attempt
        self._failed: JwksError | None = None  # the last read's error, while no set was ever read
        self._lock = asyncio.Lock()

    async def get(self, kid: str | None) -> Key | None:
        keys = await self._current()
        key = _find(keys, kid)
        if key is None and time.monotonic() - self._tried_at >= self.refresh_floor_s:
            keys = await self._current(force=True)
            key = _find(keys, kid)
        return key

    async def _current(self, *, force: bool = False) -> KeySet:
        async with self._lock:
            now = time.monotonic()
            fresh = self._keys is not None and (now - self._loaded_at < self.ttl_s
                                                or now - self._tried_at < self.refresh_floor_s)
            if fresh and not force:
                return self._keys  # type: ignore[return-value]
            if self._keys is None and self._failed is not None and now - self._tried_at < self.refresh_floor_s:
                # never read yet: at most one read per refresh_floor_s too (found by a security QA:
                # each token from anyone made the server fetch the identity provider's keys again)
                raise JwksError(str(self._failed))  # (a new one: re-raising one object grew its traceback)
            self._tried_at = now
            try:
                data = await self._read()
            except JwksError as exc:
                if self._keys is None:
                    self._failed = exc
                    raise
                # the IdP is unreachable: keep the last good set, retry after refresh_floor_s
                log.warning("%s; keeping the previous admin key set", exc)
                return self._keys
            self._keys = KeySet(_import_keys(data))
            self._loaded_at, self._failed = time.monotonic(), None
            return self._keys

    async def _read(self) -> dict:
        loc = self.location
        try:
            path = local_path(loc)
            if path is None:
                async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                    resp = await client.get(loc)
                    resp.raise_for_status()
                    data = resp.json()
            else:
                data = json.loads(await asyncio.to_thread(Path(path).read_text))
        except (OSError, ValueError, httpx.HTTPError) as exc:
            raise JwksError(_without_userinfo(f"cannot read the JWKS at {loc}: {exc}")) from exc
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise JwksError(_without_userinfo(f"{loc} is not a JWKS (no 'keys' list)"))
        # Only public asymmetric keys verify IdP tokens: drop shared secrets and private members.
        keys = [{k: v for k, v in key.items() if k not in _PRIVATE}
                for key in data["keys"] if isinstance(key, dict) and key.get("kty") in ("RSA", "EC", "OKP")]
        return {"keys": keys}


_PRIVATE = {"d", "p", "q", "dp", "dq", "qi", "oth"}


_USERINFO = re.compile(r"(\w+://)[^/\s@]+@")  # a URL's user and password


def _without_userinfo(text: str) -> str:
    """``text`` with every URL's user and password hidden (found by a security QA: a message quoted them)."""
    return _USERINFO.sub(r"\1***@", text)


def local_path(location: str) -> str | None:
    """The file a key set's location names (``file://…`` or a plain path); None for a URL."""
    if location.lower().startswith(("http://", "https://")):  # (a scheme is case-insensitive, as the setting's check)
        return None
    return location.removeprefix("file://")


def _import_keys(data: dict) -> list[Key]:
    """The set's usable keys; a malformed entry is skipped (logged) instead of failing the whole set,
    so one bad key published by an IdP does not lock every admin out."""
    keys = []
    for raw in data["keys"]:
        try:
            keys.append(JsonWebKey.import_key(raw))
        except Exception as exc:  # authlib raises assorted errors on malformed keys
            log.warning("skipping a malformed key (kid %r) in the admin JWKS: %s", raw.get("kid"), exc)
    return keys


def _find(keys: KeySet, kid: str | None) -> Key | None:
    if kid is None:
        return None
    for key in keys.keys:
        if key.kid == kid:
            return key
    return None
